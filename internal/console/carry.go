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
	"net/url"
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

// flash is what the last form did, shown once by the page the form's answer leads to,
// to the operator who sent it.
type flash struct {
	Done   []string        `json:"d,omitempty"`
	Error  string          `json:"e,omitempty"`
	Action *operate.Action `json:"a,omitempty"`
	// Operator is who sent the form ("" before a login), Page the path and query it is
	// shown on; ID tells its one showing from a replay.
	Operator string `json:"o,omitempty"`
	Page     string `json:"p"`
	ID       string `json:"i"`
	// Exp is when it is no longer shown (Unix seconds): a cookie's Max-Age is the
	// browser's to keep.
	Exp int64 `json:"x"`
}

// draft is a form as an operator typed it, put back into the intent's page: after a
// refusal, or after logging in again when the session ended before the form was sent.
type draft struct {
	Scope, Key string
	// Operator is who typed it: only their login gets it back.
	Operator string
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

// redirect answers a form with a redirect to page (POST/Redirect/GET), which shows f
// to operator.
func (h *handler) redirect(w http.ResponseWriter, r *http.Request, page, operator string, f flash) {
	f.Page, f.Operator = page, operator
	h.setFlash(w, r, f)
	http.Redirect(w, r, page, http.StatusSeeOther)
}

// setFlash carries f to its page; a message too long for a cookie (a ledger's refusal
// naming a very long key, say) is cut short.
func (h *handler) setFlash(w http.ResponseWriter, r *http.Request, f flash) {
	f.Exp, f.ID = h.now().Add(flashTTL).Unix(), randomToken()
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

// takeFlash is the flash r carries when r reads its page as its operator, the first
// time: then it is cleared from the browser, and its ID remembered until it expires, so
// that a copy of the cookie shows nothing. A flash for another page or operator stays
// where it is, unseen; one that cannot be read or has expired is cleared.
func (h *handler) takeFlash(w http.ResponseWriter, r *http.Request, operator string) flash {
	var f flash
	c, err := r.Cookie(flashCookie)
	if err != nil {
		return flash{}
	}
	if !h.open(flashCookie, c.Value, &f) || h.now().Unix() > f.Exp {
		h.clearCookie(w, r, flashCookie, "/")
		return flash{}
	}
	if f.Operator != operator || !samePage(f.Page, r.URL) {
		return flash{}
	}
	h.clearCookie(w, r, flashCookie, "/")
	if !h.shown.first(h.now(), f.ID, time.Unix(f.Exp, 0)) {
		return flash{}
	}
	return f
}

// samePage reports whether u is page (a path and query as the console writes them).
func samePage(page string, u *url.URL) bool {
	p, err := url.Parse(page)
	if err != nil || p.Path != u.Path {
		return false
	}
	a, errA := url.ParseQuery(p.RawQuery)
	b, errB := url.ParseQuery(u.RawQuery)
	return errA == nil && errB == nil && a.Encode() == b.Encode()
}

// onceSet remembers the flashes shown, until they expire: at most maxShown of them; in
// a flood of more, a copy of one may show again (it says what its operator did).
type onceSet struct {
	mu sync.Mutex
	m  map[string]time.Time
}

const maxShown = 10000

// first reports whether id is shown for the first time, and remembers it until exp.
func (o *onceSet) first(now time.Time, id string, exp time.Time) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, seen := o.m[id]; seen {
		return false
	}
	if o.m == nil {
		o.m = map[string]time.Time{}
	}
	if len(o.m) >= maxShown {
		for k, e := range o.m {
			if now.After(e) {
				delete(o.m, k)
			}
		}
	}
	if len(o.m) < maxShown {
		o.m[id] = exp
	}
	return true
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

// takeDraft is the draft r carries for scope/key, when operator typed it, cleared from
// the browser when it is taken; a draft of another operator's is dropped.
func (h *handler) takeDraft(w http.ResponseWriter, r *http.Request, scope, key, operator string) (draft, bool) {
	d, ok := h.draftIn(r)
	switch {
	case !ok || d.Operator == operator && (d.Scope != scope || d.Key != key):
		return draft{}, false
	case d.Operator != operator:
		h.clearCookie(w, r, draftCookie, "/")
		return draft{}, false
	}
	h.clearCookie(w, r, draftCookie, "/")
	return d, true
}

// dropOthersDraft drops the draft r carries when it is not operator's.
func (h *handler) dropOthersDraft(w http.ResponseWriter, r *http.Request, operator string) {
	if d, ok := h.draftIn(r); ok && d.Operator != operator {
		h.clearCookie(w, r, draftCookie, "/")
	}
}

// draftIn is the draft r carries: sealed by this console, not expired, of an operator.
func (h *handler) draftIn(r *http.Request) (draft, bool) {
	var d draft
	c, err := r.Cookie(draftCookie)
	if err != nil || !h.open(draftCookie, c.Value, &d) || h.now().Unix() > d.Exp || d.Operator == "" {
		return draft{}, false
	}
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
