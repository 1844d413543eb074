package imagetest

import (
	"bufio"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
	digest "github.com/opencontainers/go-digest"
)

// RegistryOption configures StartRegistry. Options wrap the registry handler in the
// order given: the first option sees a request first. Put WithBlobCounter first to
// count every GET, and WithBasicAuth before faults so unauthenticated requests are
// refused before anything else happens.
type RegistryOption func(*registryConfig)

type registryConfig struct {
	middlewares []func(http.Handler) http.Handler
	tls         bool
	tlsConfig   *tls.Config
	pathPrefix  string
	referrers   bool
	// closing is closed when the test ends, releasing handlers that stall on purpose.
	closing chan struct{}
}

// StartRegistry starts an in-process OCI registry (go-containerregistry's
// pkg/registry, blobs in memory) on 127.0.0.1 over plain HTTP (or HTTPS with a
// self-signed certificate, WithTLS) and returns its "host:port". It stops when the
// test ends.
func StartRegistry(t testing.TB, opts ...RegistryOption) string {
	t.Helper()
	cfg := &registryConfig{closing: make(chan struct{})}
	for _, o := range opts {
		o(cfg)
	}
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)), registry.WithReferrersSupport(cfg.referrers))
	for i := len(cfg.middlewares) - 1; i >= 0; i-- {
		h = cfg.middlewares[i](h)
	}
	if cfg.pathPrefix != "" {
		h = underPrefix(cfg.pathPrefix, h)
	}
	srv := httptest.NewUnstartedServer(h)
	if cfg.tlsConfig != nil {
		srv.TLS = cfg.tlsConfig
	}
	if cfg.tls || cfg.tlsConfig != nil {
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(func() {
		close(cfg.closing)
		srv.CloseClientConnections()
		srv.Close()
	})
	return strings.TrimPrefix(strings.TrimPrefix(srv.URL, "http://"), "https://")
}

// WithTLS serves HTTPS with httptest's self-signed certificate, which clients accept
// only if they skip verification (as they do for insecure or loopback registries).
func WithTLS() RegistryOption {
	return func(c *registryConfig) { c.tls = true }
}

// WithReferrers serves the OCI 1.1 referrers API (GET /v2/<name>/referrers/<digest>).
func WithReferrers() RegistryOption {
	return func(c *registryConfig) { c.referrers = true }
}

// WithServerTLS serves HTTPS with cfg (see CA.ServerTLS): a certificate clients must
// be told to trust, and client certificates if cfg asks for them.
func WithServerTLS(cfg *tls.Config) RegistryOption {
	return func(c *registryConfig) { c.tlsConfig = cfg }
}

// WithPathPrefix serves the registry API under prefix instead of /v2, as a registry
// needing containerd's override_path does: prefix+"/x" is served as /v2/x, and
// requests outside prefix get 404.
func WithPathPrefix(prefix string) RegistryOption {
	return func(c *registryConfig) { c.pathPrefix = strings.TrimSuffix(prefix, "/") }
}

func underPrefix(prefix string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rest, ok := strings.CutPrefix(r.URL.Path, prefix)
		if !ok || (rest != "" && !strings.HasPrefix(rest, "/")) {
			http.NotFound(w, r)
			return
		}
		r = r.Clone(r.Context())
		r.URL.Path = "/v2" + rest
		r.URL.RawPath = ""
		next.ServeHTTP(w, r)
	})
}

// WithSlowBlobs sends matching blobs chunk bytes at a time, every interval: a slow
// registry that keeps moving.
func WithSlowBlobs(match BlobMatcher, chunk int, every time.Duration) RegistryOption {
	return func(c *registryConfig) {
		blobFault(match, func(w http.ResponseWriter, r *http.Request, d digest.Digest, body []byte) {
			blobHeaders(w, d)
			w.Header().Set("Content-Length", fmt.Sprint(len(body)))
			w.WriteHeader(http.StatusOK)
			for len(body) > 0 {
				n := min(chunk, len(body))
				if _, err := w.Write(body[:n]); err != nil {
					return
				}
				w.(http.Flusher).Flush()
				body = body[n:]
				select {
				case <-time.After(every):
				case <-r.Context().Done():
					return
				case <-c.closing:
					return
				}
			}
		})(c)
	}
}

// WithMiddleware wraps the registry with mw.
func WithMiddleware(mw func(http.Handler) http.Handler) RegistryOption {
	return func(c *registryConfig) { c.middlewares = append(c.middlewares, mw) }
}

// WithBasicAuth makes every request, the /v2/ ping included, require HTTP basic auth
// with user and password, answering 401 with a Basic challenge otherwise.
func WithBasicAuth(user, password string) RegistryOption {
	return WithMiddleware(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			u, p, ok := r.BasicAuth()
			if !ok || u != user || p != password {
				w.Header().Set("WWW-Authenticate", `Basic realm="imagetest registry"`)
				writeRegistryError(w, http.StatusUnauthorized, "UNAUTHORIZED", "authentication required")
				return
			}
			next.ServeHTTP(w, r)
		})
	})
}

// TokenAuth configures WithTokenAuth.
type TokenAuth struct {
	// Username and Password are accepted by the token endpoint: as basic auth on GET
	// (docker's token flow) or as grant_type=password on POST (OAuth2).
	Username, Password string
	// RefreshToken is accepted as an OAuth2 refresh token (grant_type=refresh_token):
	// what docker and the CRI call an identity token.
	RefreshToken string
	// Token is the bearer token the endpoint issues and the only one the registry
	// accepts; a client holding it already (a CRI registry token) needs no exchange.
	Token string
}

// WithTokenAuth makes the registry require a bearer token, as Docker Hub and most
// registries do: requests without "Authorization: Bearer <Token>" get a 401 whose
// challenge names the token endpoint /token on the same server.
func WithTokenAuth(a TokenAuth) RegistryOption {
	issue := func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{
			"token": a.Token, "access_token": a.Token, "refresh_token": a.RefreshToken, "expires_in": 300,
		})
	}
	return WithMiddleware(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/token" {
				switch r.Method {
				case http.MethodGet:
					if u, p, ok := r.BasicAuth(); ok && u == a.Username && p == a.Password {
						issue(w)
						return
					}
				case http.MethodPost:
					r.ParseForm()
					switch r.PostForm.Get("grant_type") {
					case "refresh_token":
						if a.RefreshToken != "" && r.PostForm.Get("refresh_token") == a.RefreshToken {
							issue(w)
							return
						}
					case "password":
						if r.PostForm.Get("username") == a.Username && r.PostForm.Get("password") == a.Password {
							issue(w)
							return
						}
					}
				}
				writeRegistryError(w, http.StatusUnauthorized, "UNAUTHORIZED", "bad credentials for the token endpoint")
				return
			}
			if r.Header.Get("Authorization") != "Bearer "+a.Token {
				scheme := "http"
				if r.TLS != nil {
					scheme = "https"
				}
				w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer realm="%s://%s/token",service="imagetest"`, scheme, r.Host))
				writeRegistryError(w, http.StatusUnauthorized, "UNAUTHORIZED", "authentication required")
				return
			}
			next.ServeHTTP(w, r)
		})
	})
}

// WithErrorStatus answers every request that match accepts (all if match is nil)
// with status and a registry error body, e.g. to play a broken mirror.
func WithErrorStatus(status int, match func(*http.Request) bool) RegistryOption {
	return WithMiddleware(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if match != nil && !match(r) {
				next.ServeHTTP(w, r)
				return
			}
			writeRegistryError(w, status, "UNAVAILABLE", "imagetest: injected failure")
		})
	})
}

func writeRegistryError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{
		"errors": []map[string]string{{"code": code, "message": msg}},
	})
}

// BlobCounter counts the requests a registry serves, blob GETs by digest.
type BlobCounter struct {
	mu       sync.Mutex
	gets     map[digest.Digest]int
	requests int
}

// WithBlobCounter records requests in c.
func WithBlobCounter(c *BlobCounter) RegistryOption {
	return WithMiddleware(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			c.mu.Lock()
			c.requests++
			if d, ok := blobDigest(r); ok && r.Method == http.MethodGet {
				if c.gets == nil {
					c.gets = map[digest.Digest]int{}
				}
				c.gets[d]++
			}
			c.mu.Unlock()
			next.ServeHTTP(w, r)
		})
	})
}

// Gets returns how many times blob d was requested with GET.
func (c *BlobCounter) Gets(d digest.Digest) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gets[d]
}

// Counts returns a copy of the GET count of every blob requested.
func (c *BlobCounter) Counts() map[digest.Digest]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[digest.Digest]int, len(c.gets))
	for d, n := range c.gets {
		out[d] = n
	}
	return out
}

// TotalGets returns the number of blob GETs of any digest.
func (c *BlobCounter) TotalGets() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, g := range c.gets {
		n += g
	}
	return n
}

// Requests returns the number of requests of any kind.
func (c *BlobCounter) Requests() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.requests
}

// BlobMatcher selects the blobs a fault applies to; nil selects all of them.
type BlobMatcher func(digest.Digest) bool

// Blobs selects exactly the digests given.
func Blobs(ds ...digest.Digest) BlobMatcher {
	return func(d digest.Digest) bool {
		for _, x := range ds {
			if x == d {
				return true
			}
		}
		return false
	}
}

// WithTamperedBlobs serves matching blobs with one byte changed and the right length,
// so only a digest check can tell.
func WithTamperedBlobs(match BlobMatcher) RegistryOption {
	return blobFault(match, func(w http.ResponseWriter, _ *http.Request, d digest.Digest, body []byte) {
		bad := append([]byte(nil), body...)
		if len(bad) > 0 {
			bad[len(bad)/2] ^= 0xff
		}
		blobHeaders(w, d)
		w.Header().Set("Content-Length", fmt.Sprint(len(bad)))
		w.WriteHeader(http.StatusOK)
		w.Write(bad)
	})
}

// WithTamperedTails serves matching blobs with their last byte changed and the right
// length: a decompressor reads everything before it as the blob's data, and only the
// digest check at the very end (or the compressed format's own trailer) can tell.
func WithTamperedTails(match BlobMatcher) RegistryOption {
	return blobFault(match, func(w http.ResponseWriter, _ *http.Request, d digest.Digest, body []byte) {
		bad := append([]byte(nil), body...)
		if len(bad) > 0 {
			bad[len(bad)-1] ^= 0xff
		}
		blobHeaders(w, d)
		w.Header().Set("Content-Length", fmt.Sprint(len(bad)))
		w.WriteHeader(http.StatusOK)
		w.Write(bad)
	})
}

// WithOverlongBlobs serves matching blobs followed by extra bytes, without a
// Content-Length, so that only counting what arrives can tell the body is longer than
// the manifest says.
func WithOverlongBlobs(match BlobMatcher, extra []byte) RegistryOption {
	return blobFault(match, func(w http.ResponseWriter, _ *http.Request, d digest.Digest, body []byte) {
		blobHeaders(w, d)
		w.WriteHeader(http.StatusOK)
		// Flushing the headers first forces chunked encoding: no Content-Length.
		w.(http.Flusher).Flush()
		w.Write(body)
		w.Write(extra)
	})
}

// WithTruncatedBlobs serves only the first keep bytes of matching blobs and ends the
// response cleanly, without a Content-Length, so the client sees a well-formed but
// short body.
func WithTruncatedBlobs(match BlobMatcher, keep int) RegistryOption {
	return blobFault(match, func(w http.ResponseWriter, _ *http.Request, d digest.Digest, body []byte) {
		blobHeaders(w, d)
		w.WriteHeader(http.StatusOK)
		// Flushing the headers first forces chunked encoding: no Content-Length.
		w.(http.Flusher).Flush()
		w.Write(body[:min(keep, len(body))])
	})
}

// WithDyingBlobs announces the full length of matching blobs, sends the first after
// bytes and then closes the connection, like a registry that crashes mid-download.
func WithDyingBlobs(match BlobMatcher, after int) RegistryOption {
	return blobFault(match, func(w http.ResponseWriter, _ *http.Request, d digest.Digest, body []byte) {
		conn, buf, err := w.(http.Hijacker).Hijack()
		if err != nil {
			panic(err)
		}
		defer conn.Close()
		writeRawHead(buf, d, len(body))
		buf.Write(body[:min(after, len(body))])
		buf.Flush()
	})
}

// Staller holds blob downloads after their first bytes until released; see
// WithStalledBlobs.
type Staller struct {
	stalled     chan digest.Digest
	release     chan struct{}
	releaseOnce sync.Once
}

// NewStaller returns a Staller that holds downloads until Release is called.
func NewStaller() *Staller {
	return &Staller{stalled: make(chan digest.Digest, 128), release: make(chan struct{})}
}

// Stalled delivers the digest of each download as it stalls.
func (s *Staller) Stalled() <-chan digest.Digest { return s.stalled }

// Release lets every stalled download, and every later one, finish.
func (s *Staller) Release() { s.releaseOnce.Do(func() { close(s.release) }) }

// WithStalledBlobs announces the full length of matching blobs, sends the first after
// bytes, reports the stall on s.Stalled() and sends the rest only once s is released;
// a client that goes away (or the end of the test) ends the response early. It makes
// a download that hangs, for cancellation and sharing tests.
func WithStalledBlobs(match BlobMatcher, after int, s *Staller) RegistryOption {
	return func(c *registryConfig) {
		blobFault(match, func(w http.ResponseWriter, r *http.Request, d digest.Digest, body []byte) {
			blobHeaders(w, d)
			w.Header().Set("Content-Length", fmt.Sprint(len(body)))
			w.WriteHeader(http.StatusOK)
			n := min(after, len(body))
			w.Write(body[:n])
			w.(http.Flusher).Flush()
			select {
			case s.stalled <- d:
			default:
			}
			select {
			case <-s.release:
				w.Write(body[n:])
			case <-r.Context().Done():
			case <-c.closing:
			}
		})(c)
	}
}

func blobHeaders(w http.ResponseWriter, d digest.Digest) {
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Docker-Content-Digest", d.String())
}

func writeRawHead(w *bufio.ReadWriter, d digest.Digest, length int) {
	fmt.Fprintf(w, "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nDocker-Content-Digest: %s\r\nContent-Length: %d\r\n\r\n", d, length)
}

// blobFault serves GETs of matching blobs with serve, handing it the blob's true
// content as the registry would have sent it.
func blobFault(match BlobMatcher, serve func(w http.ResponseWriter, r *http.Request, d digest.Digest, body []byte)) RegistryOption {
	return WithMiddleware(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			d, ok := blobDigest(r)
			if !ok || r.Method != http.MethodGet || (match != nil && !match(d)) {
				next.ServeHTTP(w, r)
				return
			}
			rec := httptest.NewRecorder()
			next.ServeHTTP(rec, r)
			if rec.Code != http.StatusOK {
				for k, v := range rec.Header() {
					w.Header()[k] = v
				}
				w.WriteHeader(rec.Code)
				w.Write(rec.Body.Bytes())
				return
			}
			serve(w, r, d, rec.Body.Bytes())
		})
	})
}

// blobDigest returns the digest of a /v2/<name>/blobs/<digest> request.
func blobDigest(r *http.Request) (digest.Digest, bool) {
	parts := strings.Split(strings.TrimSuffix(r.URL.Path, "/"), "/")
	if len(parts) < 5 || parts[1] != "v2" || parts[len(parts)-2] != "blobs" {
		return "", false
	}
	d, err := digest.Parse(parts[len(parts)-1])
	if err != nil {
		return "", false
	}
	return d, true
}

// RequestLog records the requests a registry was sent, as "METHOD /path".
type RequestLog struct {
	mu    sync.Mutex
	paths []string
}

// Option makes the registry record its requests in l.
func (l *RequestLog) Option() RegistryOption {
	return WithMiddleware(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			l.mu.Lock()
			l.paths = append(l.paths, r.Method+" "+r.URL.Path)
			l.mu.Unlock()
			next.ServeHTTP(w, r)
		})
	})
}

// Reset forgets the requests recorded so far (a test's pushes, say).
func (l *RequestLog) Reset() {
	l.mu.Lock()
	l.paths = nil
	l.mu.Unlock()
}

// Count returns how many requests had substr in their method and path.
func (l *RequestLog) Count(substr string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, p := range l.paths {
		if strings.Contains(p, substr) {
			n++
		}
	}
	return n
}

// Paths returns a copy of the requests recorded.
func (l *RequestLog) Paths() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.paths...)
}
