package sigpolicy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/opencontainers/go-digest"
)

// What cosign writes (github.com/sigstore/cosign pkg/types and pkg/oci).
const (
	simpleSigningMediaType = "application/vnd.dev.cosign.simplesigning.v1+json"
	signatureArtifactType  = "application/vnd.dev.cosign.artifact.sig.v1+json"
	signatureAnnotation    = "dev.cosignproject.cosign/signature"
)

// Bounds on what a registry can make Verify read or do.
const (
	maxManifestSize = 4 << 20 // a signature manifest, or the referrers index
	maxPayloadSize  = 4 << 20 // a simple signing payload
	maxSignatures   = 64      // signatures considered per image
)

// errTooLarge marks a registry response over the size bounds.
var errTooLarge = errors.New("response too large")

// candidate is one signature found in the registry, not yet trusted.
type candidate struct {
	where     string        // the manifest it was found in, for messages
	layer     v1.Descriptor // the payload layer, with the signature annotation
	fetched   bool
	payload   []byte
	rejection string // why the payload could not be had, when it could not
}

// sigSource is one place cosign stores signatures in.
type sigSource struct {
	describe  string
	referrers bool // else the signature tag
	loaded    bool
	cands     []*candidate
	notes     []string // problems that left signatures out, for the message when none is accepted
}

// fetcher reads img's signatures for one Verify, once for all its requirements.
type fetcher struct {
	img     Image
	opts    []remote.Option
	sources []*sigSource
	count   int  // candidates loaded so far
	capped  bool // maxSignatures was reached
}

func newFetcher(img Image) *fetcher {
	f := &fetcher{img: img}
	f.sources = []*sigSource{
		{describe: f.sigTag().String()},
		{describe: "the referrers of " + f.subject().String(), referrers: true},
	}
	return f
}

// sigTag is cosign's signature tag for the image's digest: sha256-<hex>.sig.
func (f *fetcher) sigTag() name.Tag {
	return f.img.Repository.Tag(strings.Replace(f.img.Digest.String(), ":", "-", 1) + ".sig")
}

func (f *fetcher) subject() name.Digest {
	return f.img.Repository.Digest(f.img.Digest.String())
}

// connect makes the transport all of this Verify's requests go through: the
// caller's, with every response bounded, behind one handshake. Being a
// transport.Wrapper, go-containerregistry uses it as is rather than repeating
// the handshake for each request.
func (f *fetcher) connect(ctx context.Context) error {
	if f.opts != nil {
		return nil
	}
	rt := f.img.Transport
	if rt == nil {
		rt = remote.DefaultTransport
	}
	limited := &limitTransport{next: rt, limit: max(maxManifestSize, maxPayloadSize)}
	repo := f.img.Repository
	tr, err := transport.NewWithContext(ctx, repo.Registry, authn.Anonymous, limited, []string{repo.Scope(transport.PullScope)})
	if err != nil {
		return fmt.Errorf("connecting to %s: %w", repo.RegistryStr(), err)
	}
	f.opts = []remote.Option{remote.WithContext(ctx), remote.WithTransport(tr)}
	return nil
}

// source returns the candidates of src, loading them on first use.
func (f *fetcher) source(ctx context.Context, src *sigSource) ([]*candidate, error) {
	if src.loaded {
		return src.cands, nil
	}
	if err := f.connect(ctx); err != nil {
		return nil, err
	}
	budget := maxSignatures - f.count
	var cands []*candidate
	var notes []string
	var err error
	if src.referrers {
		cands, notes, err = f.loadReferrers(ctx, budget)
	} else {
		cands, notes, err = f.loadTag(ctx)
	}
	if err != nil {
		return nil, err
	}
	if len(cands) > budget {
		cands = cands[:budget]
		f.capped = true
	}
	f.count += len(cands)
	src.loaded, src.cands, src.notes = true, cands, notes
	return cands, nil
}

// loadTag reads the signatures in cosign's signature tag.
func (f *fetcher) loadTag(ctx context.Context) ([]*candidate, []string, error) {
	tag := f.sigTag()
	desc, err := remote.Get(tag, f.opts...)
	if isNotFound(err) {
		return nil, nil, nil
	}
	if err != nil {
		if note, ok := rejectionOf(ctx, err); ok {
			return nil, []string{fmt.Sprintf("%s: %s", tag, note)}, nil
		}
		return nil, nil, fmt.Errorf("fetching %s: %w", tag, err)
	}
	cands, note := signatureLayers(desc.MediaType, desc.Manifest, tag.String())
	if note != "" {
		return nil, []string{note}, nil
	}
	return cands, nil, nil
}

// loadReferrers reads the signatures attached as OCI 1.1 referrers.
func (f *fetcher) loadReferrers(ctx context.Context, budget int) ([]*candidate, []string, error) {
	subject := f.subject()
	idx, err := remote.Referrers(subject, append(f.opts, remote.WithFilter("artifactType", signatureArtifactType))...)
	if err == nil {
		var im *v1.IndexManifest
		if im, err = idx.IndexManifest(); err == nil {
			return f.loadReferrerManifests(ctx, im.Manifests, budget)
		}
	}
	if isNotFound(err) {
		return nil, nil, nil
	}
	if note, ok := rejectionOf(ctx, err); ok {
		return nil, []string{fmt.Sprintf("the referrers of %s: %s", subject, note)}, nil
	}
	return nil, nil, fmt.Errorf("fetching the referrers of %s: %w", subject, err)
}

func (f *fetcher) loadReferrerManifests(ctx context.Context, descs []v1.Descriptor, budget int) ([]*candidate, []string, error) {
	var cands []*candidate
	var notes []string
	for _, d := range descs {
		if len(cands) >= budget {
			f.capped = true
			break
		}
		// The registry or go-containerregistry filtered on artifactType already;
		// a registry that ignored the filter is not trusted to have.
		if d.ArtifactType != signatureArtifactType || !isManifest(d.MediaType) {
			continue
		}
		ref := f.img.Repository.Digest(d.Digest.String())
		desc, err := remote.Get(ref, f.opts...)
		if err != nil {
			if note, ok := rejectionOf(ctx, err); ok || isNotFound(err) {
				if !ok {
					note = "listed as a referrer but not found"
				}
				notes = append(notes, fmt.Sprintf("%s: %s", ref, note))
				continue
			}
			return nil, nil, fmt.Errorf("fetching %s: %w", ref, err)
		}
		found, note := signatureLayers(desc.MediaType, desc.Manifest, ref.String())
		if note != "" {
			notes = append(notes, note)
		}
		cands = append(cands, found...)
	}
	return cands, notes, nil
}

// signatureLayers returns the simple signing layers of the signature manifest
// raw found at where, or a note saying why it has none.
func signatureLayers(mt types.MediaType, raw []byte, where string) ([]*candidate, string) {
	if !isManifest(mt) {
		return nil, fmt.Sprintf("%s is a %s, not a signature manifest", where, mt)
	}
	m, err := v1.ParseManifest(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Sprintf("%s: invalid manifest: %v", where, err)
	}
	var cands []*candidate
	for _, l := range m.Layers {
		if l.MediaType == simpleSigningMediaType {
			cands = append(cands, &candidate{where: where, layer: l})
		}
	}
	if len(cands) == 0 {
		return nil, fmt.Sprintf("%s has no %s layer", where, simpleSigningMediaType)
	}
	return cands, ""
}

func isManifest(mt types.MediaType) bool {
	return mt == types.OCIManifestSchema1 || mt == types.DockerManifestSchema2
}

// loadPayload fetches c's payload blob by digest, checking its size and digest.
// A payload that cannot be had for reasons of its own (too large, corrupt) is a
// rejection of that signature; other failures are errors.
func (f *fetcher) loadPayload(ctx context.Context, c *candidate) error {
	if c.fetched {
		return nil
	}
	reject := func(format string, args ...any) error {
		c.fetched, c.rejection = true, fmt.Sprintf(format, args...)
		return nil
	}
	if c.layer.Size > maxPayloadSize {
		return reject("payload %s of %d bytes is larger than the %d allowed", c.layer.Digest, c.layer.Size, maxPayloadSize)
	}
	want, err := digest.Parse(c.layer.Digest.String())
	if err != nil {
		return reject("payload digest %q: %v", c.layer.Digest, err)
	}
	ref := f.img.Repository.Digest(c.layer.Digest.String())
	data, err := f.readBlob(ref)
	if err != nil {
		if note, ok := rejectionOf(ctx, err); ok {
			return reject("payload %s: %s", c.layer.Digest, note)
		}
		return fmt.Errorf("fetching signature payload %s: %w", ref, err)
	}
	// go-containerregistry checks the digest too; checking here keeps this
	// package's guarantee independent of how that library reads blobs.
	if !want.Algorithm().Available() {
		return reject("payload digest %s: unsupported algorithm", c.layer.Digest)
	}
	if want.Algorithm().FromBytes(data) != want {
		return reject("payload %s does not match its digest", c.layer.Digest)
	}
	if int64(len(data)) != c.layer.Size {
		return reject("payload %s has %d bytes, its descriptor says %d", c.layer.Digest, len(data), c.layer.Size)
	}
	c.fetched, c.payload = true, data
	return nil
}

func (f *fetcher) readBlob(ref name.Digest) ([]byte, error) {
	layer, err := remote.Layer(ref, f.opts...)
	if err != nil {
		return nil, err
	}
	rc, err := layer.Compressed()
	if err != nil {
		return nil, err
	}
	defer func() { _ = rc.Close() }()
	data, err := io.ReadAll(io.LimitReader(rc, maxPayloadSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxPayloadSize {
		return nil, fmt.Errorf("more than %d bytes: %w", maxPayloadSize, errTooLarge)
	}
	return data, nil
}

// isNotFound reports whether the registry said err's object does not exist.
func isNotFound(err error) bool {
	var te *transport.Error
	if !errors.As(err, &te) {
		return false
	}
	if te.StatusCode == http.StatusNotFound {
		return true
	}
	for _, d := range te.Errors {
		if d.Code == transport.ManifestUnknownErrorCode || d.Code == transport.NameUnknownErrorCode || d.Code == transport.BlobUnknownErrorCode {
			return true
		}
	}
	return false
}

// rejectionOf tells a registry response that disqualifies one signature (too
// large) from a failure to reach the registry, which makes the verdict unknown.
func rejectionOf(ctx context.Context, err error) (string, bool) {
	if ctx.Err() != nil {
		return "", false
	}
	if errors.Is(err, errTooLarge) {
		return err.Error(), true
	}
	return "", false
}

// limitTransport bounds every response body, so that a registry cannot make
// Verify read more than limit bytes per request, whatever the reader's own
// bounds (go-containerregistry allows 100 MiB manifests).
type limitTransport struct {
	next  http.RoundTripper
	limit int64
}

func (t *limitTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	if resp.ContentLength > t.limit {
		_ = resp.Body.Close()
		return nil, fmt.Errorf("%s %s: %d bytes, more than the %d allowed: %w", req.Method, req.URL.Redacted(), resp.ContentLength, t.limit, errTooLarge)
	}
	resp.Body = &limitedBody{ReadCloser: resp.Body, left: t.limit, what: req.URL.Redacted()}
	return resp, nil
}

// limitedBody fails once more than left bytes arrive.
type limitedBody struct {
	io.ReadCloser
	left int64
	what string
}

func (b *limitedBody) Read(p []byte) (int, error) {
	if int64(len(p)) > b.left+1 {
		p = p[:b.left+1]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	if b.left < 0 {
		return 0, fmt.Errorf("%s: %w", b.what, errTooLarge)
	}
	return n, err
}
