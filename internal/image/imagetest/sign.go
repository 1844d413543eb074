package imagetest

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	digest "github.com/opencontainers/go-digest"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"github.com/sigstore/sigstore/pkg/signature"
	"github.com/sigstore/sigstore/pkg/signature/payload"
)

// Media type and annotation of cosign's signatures.
const (
	cosignSimpleSigning = "application/vnd.dev.cosign.simplesigning.v1+json"
	cosignSignatureAnn  = "dev.cosignproject.cosign/signature"
)

// CosignKey is a key pair as `cosign generate-key-pair` makes (ECDSA P-256, SHA-256),
// to sign images in a test registry as cosign stores signatures.
type CosignKey struct {
	signer    signature.Signer
	PublicPEM []byte // the public key, PEM, as cosign.pub
}

// NewCosignKey returns a fresh key pair.
func NewCosignKey(t testing.TB) *CosignKey {
	t.Helper()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sv, err := signature.LoadECDSASignerVerifier(priv, crypto.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := cryptoutils.MarshalPublicKeyToPEM(priv.Public())
	if err != nil {
		t.Fatal(err)
	}
	return &CosignKey{signer: sv, PublicPEM: pub}
}

// Sign stores a signature of host/repo@d as `cosign sign --key` does: a simple
// signing payload whose identity is the repository (cosign's default), as a layer of
// the image tagged sha256-<hex>.sig in the same repository, with the base64
// signature in an annotation.
func (k *CosignKey) Sign(t testing.TB, host, repo string, d digest.Digest, opts ...remote.Option) {
	t.Helper()
	r, err := name.NewRepository(host+"/"+repo, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	p, err := payload.Cosign{Image: r.Digest(d.String())}.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	sig, err := k.signer.SignMessage(bytes.NewReader(p))
	if err != nil {
		t.Fatal(err)
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:       static.NewLayer(p, cosignSimpleSigning),
		Annotations: map[string]string{cosignSignatureAnn: base64.StdEncoding.EncodeToString(sig)},
	})
	if err != nil {
		t.Fatal(err)
	}
	tag := r.Tag(strings.Replace(d.String(), ":", "-", 1) + ".sig")
	if err := remote.Write(tag, img, opts...); err != nil {
		t.Fatalf("imagetest: push signature %s: %v", tag, err)
	}
}
