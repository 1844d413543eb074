package sigpolicy

import (
	"encoding/json"
	"maps"
	"slices"

	"github.com/opencontainers/go-digest"
	"github.com/sigstore/sigstore/pkg/signature/payload"
)

// signedClaims is what a verified simple signing payload says.
type signedClaims struct {
	dockerReference string
	manifestDigest  digest.Digest
}

// parsePayload parses a simple signing payload whose signature has been
// verified. It is as strict as containers/image (exactly the critical fields,
// no duplicate keys) so that no two readers of one signed payload can disagree
// about what it says.
func parsePayload(data []byte) (signedClaims, error) {
	if err := checkSyntax(data); err != nil {
		return signedClaims{}, err
	}
	var critical, optional json.RawMessage
	if err := decodeExact(data, "", map[string]any{"critical": &critical, "optional": &optional}); err != nil {
		return signedClaims{}, err
	}
	// cosign writes "optional": null when the signer gave no annotations.
	if jsonKind(optional) != "null" && jsonKind(optional) != "an object" {
		return signedClaims{}, errorAt("optional", "must be an object or null, not %s", jsonKind(optional))
	}
	var typ string
	var image, identity json.RawMessage
	if err := decodeExact(critical, "critical", map[string]any{"type": &typ, "image": &image, "identity": &identity}); err != nil {
		return signedClaims{}, err
	}
	if typ != payload.CosignSignatureType {
		return signedClaims{}, errorAt("critical.type", "%q is not %q", typ, payload.CosignSignatureType)
	}
	var claims signedClaims
	var d string
	if err := decodeExact(image, "critical.image", map[string]any{"docker-manifest-digest": &d}); err != nil {
		return signedClaims{}, err
	}
	parsed, err := digest.Parse(d)
	if err != nil {
		return signedClaims{}, errorAt(`critical.image["docker-manifest-digest"]`, "invalid digest %q: %w", d, err)
	}
	claims.manifestDigest = parsed
	if err := decodeExact(identity, "critical.identity", map[string]any{"docker-reference": &claims.dockerReference}); err != nil {
		return signedClaims{}, err
	}
	return claims, nil
}

// decodeExact decodes the object raw whose members are exactly those of fields.
func decodeExact(raw json.RawMessage, path string, fields map[string]any) error {
	seen := map[string]bool{}
	if err := decodeObject(raw, path, func(key string) (any, error) {
		dst, ok := fields[key]
		if !ok {
			return nil, nil
		}
		seen[key] = true
		return dst, nil
	}); err != nil {
		return err
	}
	for _, key := range slices.Sorted(maps.Keys(fields)) {
		if !seen[key] {
			return errorAt(childPath(path, key), "missing")
		}
	}
	return nil
}
