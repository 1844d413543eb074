package sigpolicy

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/distribution/reference"
)

// signedIdentity types of containers-policy.json(5).
const (
	matchExact             = "matchExact"
	matchRepoDigestOrExact = "matchRepoDigestOrExact"
	matchRepository        = "matchRepository"
	exactReference         = "exactReference"
	exactRepository        = "exactRepository"
	remapIdentity          = "remapIdentity"
)

// identityRule is a parsed signedIdentity: what identity a signature must claim.
type identityRule struct {
	typ                  string
	ref                  reference.Named // exactReference, exactRepository
	prefix, signedPrefix string          // remapIdentity
}

// policyReference is the identity of named as containers/image's docker
// transport sees it: a name alone means its latest tag, and a name with both a
// tag and a digest (which that transport refuses) is taken by its digest, which
// is what was pulled.
func policyReference(named reference.Named) reference.Named {
	if c, ok := named.(reference.Canonical); ok {
		if _, tagged := named.(reference.NamedTagged); tagged {
			if byDigest, err := reference.WithDigest(reference.TrimNamed(named), c.Digest()); err == nil {
				return byDigest
			}
		}
		return named
	}
	return reference.TagNameOnly(named)
}

// scopeCandidates returns the transports.docker scopes that can apply to ref,
// most specific first, as containers/image's docker transport
// (PolicyConfigurationIdentity, then PolicyConfigurationNamespaces): the image,
// the repository, its parent namespaces, the host, then the host's wildcard
// domains (without the port) from the longest.
func scopeCandidates(ref reference.Named) []string {
	name := ref.Name()
	identity := name
	switch r := ref.(type) {
	case reference.Canonical:
		identity += "@" + r.Digest().String()
	case reference.NamedTagged:
		identity += ":" + r.Tag()
	}
	res := []string{identity}
	for {
		res = append(res, name)
		slash := strings.LastIndex(name, "/")
		if slash < 0 {
			break
		}
		name = name[:slash]
	}
	if colon := strings.Index(name, ":"); colon >= 0 {
		name = name[:colon]
	}
	for {
		dot := strings.Index(name, ".")
		if dot < 0 {
			break
		}
		name = name[dot+1:]
		res = append(res, "*."+name)
	}
	return res
}

// match reports whether a signature claiming the identity signed is acceptable
// for an image identified as intended, following containers/image's
// policy_reference_match.go; when it is not, the reason says why.
func (r identityRule) match(intended reference.Named, signed string) (ok bool, reason string) {
	sig, err := reference.ParseNormalizedNamed(signed)
	if err != nil {
		return false, fmt.Sprintf("signed identity %q is not a valid reference: %v", signed, err)
	}
	mismatch := func(want, rule string) string {
		return fmt.Sprintf("signed identity %q does not match %q (signedIdentity %s)", signed, want, rule)
	}
	switch r.typ {
	case matchExact:
		if reference.IsNameOnly(sig) || sig.String() != intended.String() {
			return false, mismatch(intended.String(), r.typ)
		}
		return true, ""
	case matchRepository:
		if sig.Name() != intended.Name() {
			return false, mismatch(intended.Name(), r.typ)
		}
		return true, ""
	case exactReference:
		if reference.IsNameOnly(sig) || sig.String() != r.ref.String() {
			return false, mismatch(r.ref.String(), r.typ)
		}
		return true, ""
	case exactRepository:
		if sig.Name() != r.ref.Name() {
			return false, mismatch(r.ref.Name(), r.typ)
		}
		return true, ""
	case remapIdentity:
		remapped, err := r.remap(intended)
		if err != nil {
			return false, err.Error()
		}
		return repoDigestOrExact(remapped, sig, signed, r.typ)
	default: // matchRepoDigestOrExact, the default
		return repoDigestOrExact(intended, sig, signed, matchRepoDigestOrExact)
	}
}

// repoDigestOrExact is matchRepoDigestOrExact: an image pulled by tag needs a
// signature of exactly that tag; one pulled by digest needs a signature in the
// same repository (the digest itself is checked against the payload's).
func repoDigestOrExact(intended, sig reference.Named, signed, rule string) (bool, string) {
	if reference.IsNameOnly(sig) {
		return false, fmt.Sprintf("signed identity %q names a repository only, which signedIdentity %s never accepts "+
			"(cosign signs that by default; accept it with signedIdentity matchRepository or exactRepository, or sign with --sign-container-identity)",
			signed, rule)
	}
	switch intended.(type) {
	case reference.Canonical:
		if sig.Name() != intended.Name() {
			return false, fmt.Sprintf("signed identity %q is not in repository %q (signedIdentity %s, image pulled by digest)", signed, intended.Name(), rule)
		}
		return true, ""
	default:
		if sig.String() != intended.String() {
			return false, fmt.Sprintf("signed identity %q does not match %q (signedIdentity %s)", signed, intended.String(), rule)
		}
		return true, ""
	}
}

// remap replaces r.prefix by r.signedPrefix in ref when ref's name starts with
// it (as a whole path component), as containers/image's remapIdentity does.
func (r identityRule) remap(ref reference.Named) (reference.Named, error) {
	name := ref.Name()
	if name != r.prefix && !(strings.HasPrefix(name, r.prefix) && name[len(r.prefix)] == '/') {
		return ref, nil
	}
	s := r.signedPrefix + strings.TrimPrefix(ref.String(), r.prefix)
	remapped, err := reference.ParseNamed(s)
	if err != nil {
		return nil, fmt.Errorf("remapping %q to %q: %w", ref.String(), s, err)
	}
	return remapped, nil
}

var (
	remapDomain       = regexp.MustCompile("^" + reference.DomainRegexp.String() + "$")
	remapDomainPrefix = regexp.MustCompile("^" + reference.DomainRegexp.String() + "/")
	remapName         = regexp.MustCompile("^" + reference.NameRegexp.String() + "$")
)

// validateRemapPrefix checks a remapIdentity prefix: a host[:port], or a
// repository or namespace starting with one, never with a tag or digest.
func validateRemapPrefix(s string) error {
	if remapDomain.MatchString(s) || (remapName.MatchString(s) && remapDomainPrefix.MatchString(s)) {
		return nil
	}
	return fmt.Errorf("prefix %q is neither a host[:port] nor a host[:port]/namespace in the fully expanded form", s)
}
