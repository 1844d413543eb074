package remote

import (
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/containerd/errdefs"
)

// manifestLimiter cuts manifest responses off at maxManifestSize while they arrive.
// The registry client reads up to 100 MiB of a manifest into memory before crisp can
// measure it, and a manifest is read before anything verifies it when it is pulled by
// tag: a registry, or a man in the middle of a plain-HTTP mirror, could make every
// pull hold that much.
type manifestLimiter struct {
	next http.RoundTripper
}

func limitManifests(next http.RoundTripper) http.RoundTripper {
	return &manifestLimiter{next: next}
}

func (m *manifestLimiter) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := m.next.RoundTrip(req)
	if err != nil || req.Method != http.MethodGet || !strings.Contains(req.URL.Path, "/manifests/") {
		return resp, err
	}
	// Not an error of RoundTrip: the client would report it as the host being
	// unreachable.
	what := req.URL.Host + req.URL.Path
	if resp.ContentLength > maxManifestSize {
		_ = resp.Body.Close()
		resp.Body = io.NopCloser(&failReader{err: manifestTooLarge(what, resp.ContentLength)})
		return resp, nil
	}
	resp.Body = &limitedBody{ReadCloser: resp.Body, left: maxManifestSize, what: what}
	return resp, nil
}

// manifestTooLarge says, as getManifest does of a manifest it has read, that the
// manifest at what is too large: size bytes as announced, or -1 when it arrives longer.
func manifestTooLarge(what string, size int64) error {
	if size < 0 {
		return fmt.Errorf("manifest %s is larger than the %d allowed: %w", what, maxManifestSize, errdefs.ErrInvalidArgument)
	}
	return fmt.Errorf("manifest %s of %d bytes is larger than the %d allowed: %w", what, size, maxManifestSize, errdefs.ErrInvalidArgument)
}

// limitedBody fails once more than left bytes arrive.
type limitedBody struct {
	io.ReadCloser
	left int64
	what string
}

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.left < 0 {
		return 0, manifestTooLarge(b.what, -1)
	}
	if int64(len(p)) > b.left+1 {
		p = p[:b.left+1]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	if b.left < 0 {
		return 0, manifestTooLarge(b.what, -1)
	}
	return n, err
}

type failReader struct{ err error }

func (f *failReader) Read([]byte) (int, error) { return 0, f.err }
