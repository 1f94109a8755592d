package daemon_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/extworker/extworker/camunda7"
	"github.com/extworker/extworker/internal/daemon"
)

// writeClientCert makes a self-signed client certificate and key, as PEM files.
func writeClientCert(t *testing.T, dir string) (certFile, keyFile string, cert *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "extworker-test-client"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err = x509.ParseCertificate(der)
	require.NoError(t, err)
	kder, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	certFile, keyFile = filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600))
	return certFile, keyFile, cert
}

// An engine behind HTTPS with a private CA that requires client certificates: reached
// with EXTWORKER_ENGINE_CA_FILE and EXTWORKER_ENGINE_CERT_FILE/KEY_FILE, refused without.
func TestEngineMutualTLS(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, clientCert := writeClientCert(t, dir)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"version":"7.24.0"}`))
	}))
	clientCAs := x509.NewCertPool()
	clientCAs.AddCert(clientCert)
	srv.TLS = &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: clientCAs}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	caFile := filepath.Join(dir, "ca.pem")
	require.NoError(t, os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600))

	version := func(c daemon.Config) error {
		cl, err := daemon.NewClient(c, nil)
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		v, err := cl.Version(ctx)
		if err == nil {
			assert.Equal(t, "7.24.0", v)
		}
		return err
	}
	base := daemon.Config{EngineURL: srv.URL + "/engine-rest", EngineTimeout: 5 * time.Second}

	withAll := base
	withAll.EngineCAFile, withAll.EngineCertFile, withAll.EngineKeyFile = caFile, certFile, keyFile
	require.NoError(t, version(withAll), "custom CA and client certificate")

	noCert := base
	noCert.EngineCAFile = caFile
	err := version(noCert)
	require.Error(t, err, "the server requires a client certificate")
	assert.True(t, errors.Is(err, camunda7.ErrNotSent) || errors.Is(err, camunda7.ErrUnknownOutcome), err)

	noCA := base
	noCA.EngineCertFile, noCA.EngineKeyFile = certFile, keyFile
	err = version(noCA)
	require.Error(t, err, "the system roots do not know the private CA")
	assert.ErrorIs(t, err, camunda7.ErrNotSent, "a failed handshake sends nothing")
}
