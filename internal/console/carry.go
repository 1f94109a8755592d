package console

import (
	"bytes"
	"compress/flate"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/extworker/extworker/internal/operate"
)

// This file carries what a form did, and a form as it was typed, across a redirect:
// every form is answered with 303 See Other to a page (POST/Redirect/GET), so that a
// reload never posts it again. Both travel in cookies sealed with AES-GCM under a key
// derived from the session key (tampering is refused, reading them takes the key), that
// live minutes and are read once. Neither holds a password, and neither is logged.

// flash is what the last form did, shown once by the next page.
type flash struct {
	Done   []string        `json:"d,omitempty"`
	Error  string          `json:"e,omitempty"`
	Action *operate.Action `json:"a,omitempty"`
	// Exp is when it is no longer shown (Unix seconds): a cookie's Max-Age is the
	// browser's to keep.
	Exp int64 `json:"x"`
}

// draft is a form as an operator typed it, put back into the intent's page: after a
// refusal, or after logging in again when the session ended before the form was sent.
type draft struct {
	Scope, Key string
	// Operator is who typed it, when known: another operator's login does not get it.
	Operator string       `json:",omitempty"`
	Resolve  *resolveForm `json:",omitempty"`
	Decide   *decideForm  `json:",omitempty"`
	Exp      int64
}

// decideForm is an approval's or rejection's form as typed.
type decideForm struct {
	ID      int64
	Approve bool
	Reason  string
}

const (
	flashTTL = 2 * time.Minute
	draftTTL = 15 * time.Minute
	// maxSealed keeps a cookie under the 4096 bytes browsers keep.
	maxSealed = 3800
)

// setFlash carries f to the next page; a message too long for a cookie (a ledger's
// refusal naming a very long key, say) is cut short.
func (h *handler) setFlash(w http.ResponseWriter, r *http.Request, f flash) {
	f.Exp = h.now().Add(flashTTL).Unix()
	v, ok := h.seal(flashCookie, f)
	if !ok {
		f.Error = shorten(f.Error, 600)
		for i := range f.Done {
			f.Done[i] = shorten(f.Done[i], 600)
		}
		if f.Action != nil {
			f.Action.Message = shorten(f.Action.Message, 600)
		}
		v, ok = h.seal(flashCookie, f)
	}
	if ok {
		h.setCookie(w, r, &http.Cookie{Name: flashCookie, Value: v, MaxAge: int(flashTTL / time.Second)})
	}
}

// shorten is s cut to at most n bytes, at a character's start, marked as cut.
func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + " […]"
}

// takeFlash is the flash r carries, cleared from the browser.
func (h *handler) takeFlash(w http.ResponseWriter, r *http.Request) flash {
	var f flash
	c, err := r.Cookie(flashCookie)
	if err != nil {
		return f
	}
	h.clearCookie(w, r, flashCookie, "/")
	if !h.open(flashCookie, c.Value, &f) || h.now().Unix() > f.Exp {
		return flash{}
	}
	return f
}

// setDraft keeps d for the intent's page; false when it is too long for a cookie.
func (h *handler) setDraft(w http.ResponseWriter, r *http.Request, d draft) bool {
	d.Exp = h.now().Add(draftTTL).Unix()
	v, ok := h.seal(draftCookie, d)
	if ok {
		h.setCookie(w, r, &http.Cookie{Name: draftCookie, Value: v, MaxAge: int(draftTTL / time.Second)})
	}
	return ok
}

// takeDraft is the draft r carries for scope/key and operator, cleared from the browser
// when it is taken.
func (h *handler) takeDraft(w http.ResponseWriter, r *http.Request, scope, key, operator string) (draft, bool) {
	var d draft
	c, err := r.Cookie(draftCookie)
	if err != nil || !h.open(draftCookie, c.Value, &d) || h.now().Unix() > d.Exp {
		return draft{}, false
	}
	if d.Scope != scope || d.Key != key || d.Operator != "" && d.Operator != operator {
		return draft{}, false
	}
	h.clearCookie(w, r, draftCookie, "/")
	return d, true
}

// aead is the cipher sealing the cookies, keyed by the session key.
func (h *handler) aead() cipher.AEAD {
	m := hmac.New(sha256.New, h.key)
	m.Write([]byte("extworker console: sealed cookies"))
	block, _ := aes.NewCipher(m.Sum(nil)) // 32 bytes: never fails
	g, _ := cipher.NewGCM(block)
	return g
}

// compressors are reused: a flate.Writer is a large allocation.
var compressors = sync.Pool{New: func() any {
	w, _ := flate.NewWriter(nil, flate.DefaultCompression)
	return w
}}

// seal is v compressed and sealed for the cookie name; false when too long.
func (h *handler) seal(name string, v any) (string, bool) {
	raw, err := json.Marshal(v)
	if err != nil {
		return "", false
	}
	var z bytes.Buffer
	fw := compressors.Get().(*flate.Writer)
	fw.Reset(&z)
	_, _ = fw.Write(raw)
	_ = fw.Close()
	compressors.Put(fw)
	g := h.aead()
	nonce := make([]byte, g.NonceSize())
	_, _ = rand.Read(nonce)
	out := base64.RawURLEncoding.EncodeToString(g.Seal(nonce, nonce, z.Bytes(), []byte(name)))
	return out, len(out) <= maxSealed
}

// open reads into v what seal sealed for the cookie name.
func (h *handler) open(name, sealed string, v any) bool {
	b, err := base64.RawURLEncoding.DecodeString(sealed)
	g := h.aead()
	if err != nil || len(b) < g.NonceSize() {
		return false
	}
	z, err := g.Open(nil, b[:g.NonceSize()], b[g.NonceSize():], []byte(name))
	if err != nil {
		return false
	}
	raw, err := io.ReadAll(io.LimitReader(flate.NewReader(bytes.NewReader(z)), 64<<10))
	return err == nil && json.Unmarshal(raw, v) == nil
}
