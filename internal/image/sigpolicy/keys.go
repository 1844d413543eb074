package sigpolicy

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"encoding/pem"
	"fmt"

	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"github.com/sigstore/sigstore/pkg/signature"
)

// minRSABits is the smallest RSA modulus accepted, as sigstore's own key checks.
const minRSABits = 2048

// publicKey is one trusted key of a sigstoreSigned requirement.
type publicKey struct {
	label     string // the key file, or which keyData entry, for messages
	verifiers []signature.Verifier
}

// parseKey parses the PEM public key data for the policy entry at path; label
// names the key in refusals, file (if any) the file it was read from.
func parseKey(data []byte, label, file, path string) (*publicKey, error) {
	what := "public key"
	if file != "" {
		what += " " + file
	}
	block, rest := pem.Decode(data)
	if block == nil {
		return nil, errorAt(path, "%s: no PEM block found", what)
	}
	// A second key in the same file would otherwise be ignored without a word,
	// leaving the administrator believing it is trusted.
	if extra, _ := pem.Decode(rest); extra != nil {
		return nil, errorAt(path, "%s: more than one PEM block; give each key its own entry in keyPaths or keyDatas", what)
	}
	pub, err := cryptoutils.UnmarshalPEMToPublicKey(data)
	if err != nil {
		return nil, errorAt(path, "%s: %w", what, err)
	}
	verifiers, err := verifiersFor(pub)
	if err != nil {
		return nil, errorAt(path, "%s: %w", what, err)
	}
	return &publicKey{label: label, verifiers: verifiers}, nil
}

// verifiersFor returns the verifiers a signature by pub is checked with.
//
// cosign signs and verifies with SHA-256 whatever the key unless told otherwise
// (--signature-digest-algorithm), and containers/image verifies with SHA-256 only;
// sigstore's algorithm registry pairs P-384 with SHA-384 and P-521 with SHA-512,
// which newer signers use. Accepting either hash for those curves admits what
// the key's holder signed with any of these tools, at no cost in strength.
func verifiersFor(pub crypto.PublicKey) ([]signature.Verifier, error) {
	var hashes []crypto.Hash
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		switch k.Curve {
		case elliptic.P256():
			hashes = []crypto.Hash{crypto.SHA256}
		case elliptic.P384():
			hashes = []crypto.Hash{crypto.SHA256, crypto.SHA384}
		case elliptic.P521():
			hashes = []crypto.Hash{crypto.SHA256, crypto.SHA512}
		default:
			return nil, fmt.Errorf("ECDSA curve %s is not supported (P-256, P-384 or P-521)", k.Curve.Params().Name)
		}
	case *rsa.PublicKey:
		if k.N.BitLen() < minRSABits {
			return nil, fmt.Errorf("RSA key of %d bits is too weak (at least %d)", k.N.BitLen(), minRSABits)
		}
		// PKCS #1 v1.5, as cosign's verifiers for RSA keys.
		hashes = []crypto.Hash{crypto.SHA256}
	case ed25519.PublicKey:
		// Pure Ed25519: LoadVerifier ignores the hash for it.
		hashes = []crypto.Hash{crypto.SHA256}
	default:
		return nil, fmt.Errorf("unsupported public key type %T", pub)
	}
	verifiers := make([]signature.Verifier, 0, len(hashes))
	for _, h := range hashes {
		v, err := signature.LoadVerifier(pub, h)
		if err != nil {
			return nil, err
		}
		verifiers = append(verifiers, v)
	}
	return verifiers, nil
}

// verifies reports whether sig is a signature of payload by k.
func (k *publicKey) verifies(sig, payload []byte) bool {
	for _, v := range k.verifiers {
		if v.VerifySignature(bytes.NewReader(sig), bytes.NewReader(payload)) == nil {
			return true
		}
	}
	return false
}
