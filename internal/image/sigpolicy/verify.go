package sigpolicy

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/distribution/reference"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/opencontainers/go-digest"
)

// Image is a resolved image to check.
type Image struct {
	Named      reference.Named   // normalized, e.g. docker.io/library/busybox:1.36 or with @digest: the identity the policy is looked up and matched with
	Digest     digest.Digest     // the digest the reference resolved to: the index's if there is one, else the manifest's (what `cosign sign` signs)
	Repository name.Repository   // where the signatures are fetched (may be a mirror's repository)
	Transport  http.RoundTripper // authenticated transport for Repository; nil means go-containerregistry's default, anonymous
}

// maxReasons bounds how many rejected signatures an error lists.
const maxReasons = 3

// Verify returns nil when the policy admits img. A refusal wraps errdefs.ErrPermissionDenied and names the image, the scope
// that applied, the requirement and why it failed; a failure to fetch signatures wraps errdefs.ErrUnavailable; a done ctx
// gives its error.
func (p *Policy) Verify(ctx context.Context, img Image) error {
	if img.Named == nil {
		return fmt.Errorf("signature policy %s: image without a name: %w", p.source, errdefs.ErrInvalidArgument)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("image %s: checking signature policy: %w", img.Named, err)
	}
	ref := policyReference(img.Named)
	sc := p.scopeFor(ref)
	var f *fetcher
	for i, r := range sc.reqs {
		var reason string
		switch r.typ {
		case typeInsecureAcceptAnything:
			continue
		case typeReject:
			reason = `image rejected by "reject"`
		case typeSigstoreSigned:
			if f == nil {
				if err := checkImage(img); err != nil {
					return err
				}
				f = newFetcher(img)
			}
			var err error
			if reason, err = f.evaluate(ctx, r, ref); err != nil {
				return p.unavailable(ctx, img, sc, err)
			}
		default: // Parse keeps no other type for the docker transport
			reason = fmt.Sprintf("requirement type %q cannot be evaluated", r.typ)
		}
		if reason != "" {
			return p.denied(img, sc, i, r, reason)
		}
	}
	return nil
}

// Describe returns a one-line description of the requirements that apply to named (for logs), e.g. `sigstoreSigned (scope "registry.example/team")`.
func (p *Policy) Describe(named reference.Named) string {
	sc := p.global
	if named != nil {
		sc = p.scopeFor(policyReference(named))
	}
	types := make([]string, len(sc.reqs))
	for i, r := range sc.reqs {
		types[i] = r.typ
	}
	return fmt.Sprintf("%s (%s)", strings.Join(types, ", "), sc.name)
}

// scopeFor returns the requirements that apply to ref: its most specific
// transports.docker scope, else the transport default "", else the default.
func (p *Policy) scopeFor(ref reference.Named) *scope {
	if p.docker != nil {
		for _, c := range scopeCandidates(ref) {
			if sc, ok := p.docker[c]; ok {
				return sc
			}
		}
		if sc, ok := p.docker[""]; ok {
			return sc
		}
	}
	return p.global
}

// checkImage checks what a signature check needs of img beyond its name.
func checkImage(img Image) error {
	if err := img.Digest.Validate(); err != nil {
		return fmt.Errorf("image %s: resolved digest %q: %w: %w", img.Named, img.Digest, err, errdefs.ErrInvalidArgument)
	}
	if img.Repository.RepositoryStr() == "" || img.Repository.RegistryStr() == "" {
		return fmt.Errorf("image %s: no repository to fetch signatures from: %w", img.Named, errdefs.ErrInvalidArgument)
	}
	return nil
}

func (p *Policy) denied(img Image, sc *scope, i int, r *requirement, reason string) error {
	req := r.typ
	if len(sc.reqs) > 1 {
		req = fmt.Sprintf("%s (requirement %d of %d)", r.typ, i+1, len(sc.reqs))
	}
	return fmt.Errorf("image %s rejected by signature policy %s: %s requires %s: %s: %w",
		img.Named, p.source, sc.path, req, reason, errdefs.ErrPermissionDenied)
}

func (p *Policy) unavailable(ctx context.Context, img Image, sc *scope, err error) error {
	// A cancelled pull is neither a refusal nor the registry's fault.
	if ctxErr := ctx.Err(); ctxErr != nil {
		return fmt.Errorf("image %s: checking signatures: %w", img.Named, ctxErr)
	}
	return fmt.Errorf("image %s: fetching signatures from %s, as %s of signature policy %s requires: %w: %w",
		img.Named, img.Repository, sc.path, p.source, errdefs.ErrUnavailable, err)
}

// evaluate checks the image's signatures against the sigstoreSigned r; it
// returns why none is accepted, or "" when one is.
func (f *fetcher) evaluate(ctx context.Context, r *requirement, ref reference.Named) (string, error) {
	// containers/image checks a by-digest reference against the manifest before
	// any signature; a caller passing another digest would otherwise have the
	// signatures of one image admit another name.
	if c, ok := ref.(reference.Canonical); ok && c.Digest() != f.img.Digest {
		return fmt.Sprintf("the reference's digest %s is not the resolved digest %s", c.Digest(), f.img.Digest), nil
	}
	var reasons, notes []string
	for _, src := range f.sources {
		cands, err := f.source(ctx, src)
		if err != nil {
			return "", err
		}
		notes = append(notes, src.notes...)
		for _, c := range cands {
			if err := ctx.Err(); err != nil {
				return "", err
			}
			reason, err := f.check(ctx, r, ref, c)
			if err != nil {
				return "", err
			}
			if reason == "" {
				return "", nil
			}
			reasons = append(reasons, reason)
		}
	}
	return f.summarize(reasons, notes), nil
}

// summarize says why no signature was accepted.
func (f *fetcher) summarize(reasons, notes []string) string {
	var b strings.Builder
	switch len(reasons) {
	case 0:
		fmt.Fprintf(&b, "no signature found at %s or in %s", f.sources[0].describe, f.sources[1].describe)
	case 1:
		b.WriteString(reasons[0])
	default:
		fmt.Fprintf(&b, "none of the %d signatures found is accepted: %s", len(reasons), strings.Join(reasons[:min(len(reasons), maxReasons)], "; "))
		if len(reasons) > maxReasons {
			fmt.Fprintf(&b, "; and %d more", len(reasons)-maxReasons)
		}
	}
	if len(notes) > 0 {
		fmt.Fprintf(&b, " (ignored: %s)", strings.Join(notes[:min(len(notes), maxReasons)], "; "))
	}
	if f.capped {
		fmt.Fprintf(&b, " (only the first %d signatures were considered)", maxSignatures)
	}
	return b.String()
}

// check returns why the signature c does not satisfy r, or "" when it does.
// Nothing of the payload is believed before its signature verifies.
func (f *fetcher) check(ctx context.Context, r *requirement, ref reference.Named, c *candidate) (string, error) {
	why := func(format string, args ...any) string {
		return fmt.Sprintf("in %s: ", c.where) + fmt.Sprintf(format, args...)
	}
	b64, ok := c.layer.Annotations[signatureAnnotation]
	if !ok {
		return why("layer %s has no %s annotation", c.layer.Digest, signatureAnnotation), nil
	}
	sig, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return why("signature is not valid base64: %v", err), nil
	}
	if err := f.loadPayload(ctx, c); err != nil {
		return "", err
	}
	if c.rejection != "" {
		return why("%s", c.rejection), nil
	}
	if !anyKeyVerifies(r.keys, sig, c.payload) {
		return why("signature does not verify with %s", describeKeys(r.keys)), nil
	}
	claims, err := parsePayload(c.payload)
	if err != nil {
		return why("signed payload is not a valid cosign simple signing payload: %v", err), nil
	}
	if claims.manifestDigest != f.img.Digest {
		return why("signed digest %s is not the image's digest %s", claims.manifestDigest, f.img.Digest), nil
	}
	if ok, reason := r.identity.match(ref, claims.dockerReference); !ok {
		return why("%s", reason), nil
	}
	return "", nil
}

func anyKeyVerifies(keys []*publicKey, sig, payload []byte) bool {
	for _, k := range keys {
		if k.verifies(sig, payload) {
			return true
		}
	}
	return false
}

func describeKeys(keys []*publicKey) string {
	if len(keys) == 1 {
		return "key " + keys[0].label
	}
	labels := make([]string, len(keys))
	for i, k := range keys {
		labels[i] = k.label
	}
	return "any of the keys " + strings.Join(labels, ", ")
}
