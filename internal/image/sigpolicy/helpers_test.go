package sigpolicy

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/distribution/reference"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/opencontainers/go-digest"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"github.com/sigstore/sigstore/pkg/signature"
	"github.com/sigstore/sigstore/pkg/signature/payload"
)

// testRegistry is go-containerregistry's in-memory registry on loopback.
type testRegistry struct {
	host string // 127.0.0.1:port
	srv  *httptest.Server
}

// newRegistry starts a registry, with the OCI 1.1 Referrers API when referrers
// (else go-containerregistry's writer keeps the sha256-<hex> fallback tag).
// wrap, when not nil, sits in front of it.
func newRegistry(t testing.TB, referrers bool, wrap func(http.Handler) http.Handler) *testRegistry {
	t.Helper()
	var h = registry.New(registry.Logger(log.New(io.Discard, "", 0)), registry.WithReferrersSupport(referrers))
	if wrap != nil {
		h = wrap(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &testRegistry{host: strings.TrimPrefix(srv.URL, "http://"), srv: srv}
}

func (r *testRegistry) repo(t testing.TB, path string) name.Repository {
	t.Helper()
	repo, err := name.NewRepository(r.host+"/"+path, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	return repo
}

// pushImage pushes a random single-manifest image to repo:tag.
func pushImage(t testing.TB, repo name.Repository, tag string) digest.Digest {
	t.Helper()
	img, err := random.Image(64, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(repo.Tag(tag), img); err != nil {
		t.Fatal(err)
	}
	h, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return digest.Digest(h.String())
}

// pushIndex pushes a random two-platform index to repo:tag.
func pushIndex(t testing.TB, repo name.Repository, tag string) digest.Digest {
	t.Helper()
	idx, err := random.Index(64, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(repo.Tag(tag), idx); err != nil {
		t.Fatal(err)
	}
	h, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return digest.Digest(h.String())
}

// testKey is a signing key with its public half in a PEM file.
type testKey struct {
	signer  signature.Signer
	pem     []byte
	pemPath string
}

func writeKey(t testing.TB, pub crypto.PublicKey, signer signature.Signer) *testKey {
	t.Helper()
	pemBytes, err := cryptoutils.MarshalPublicKeyToPEM(pub)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.CreateTemp(t.TempDir(), "key-*.pub")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(pemBytes); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return &testKey{signer: signer, pem: pemBytes, pemPath: f.Name()}
}

// newECDSAKey is a key as `cosign generate-key-pair` makes: ECDSA P-256, SHA-256.
func newECDSAKey(t testing.TB) *testKey {
	t.Helper()
	return newECDSAKeyOn(t, elliptic.P256(), crypto.SHA256)
}

// newECDSAKeyOn is an ECDSA key on curve, signing hashes made with h.
func newECDSAKeyOn(t testing.TB, curve elliptic.Curve, h crypto.Hash) *testKey {
	t.Helper()
	priv, err := ecdsa.GenerateKey(curve, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sv, err := signature.LoadECDSASignerVerifier(priv, h)
	if err != nil {
		t.Fatal(err)
	}
	return writeKey(t, priv.Public(), sv)
}

// cosignPayload is the payload `cosign sign` makes for repo@d; identity ""
// is cosign's default (the repository name alone).
func cosignPayload(t testing.TB, repo name.Repository, d digest.Digest, identity string) []byte {
	t.Helper()
	b, err := payload.Cosign{Image: repo.Digest(d.String()), ClaimedIdentity: identity}.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// sigLayer is one signature as cosign stores it: the payload as a layer, the
// base64 signature in an annotation.
func sigLayer(t testing.TB, k *testKey, p []byte) mutate.Addendum {
	t.Helper()
	sig, err := k.signer.SignMessage(bytes.NewReader(p))
	if err != nil {
		t.Fatal(err)
	}
	return mutate.Addendum{
		Layer:       static.NewLayer(p, simpleSigningMediaType),
		Annotations: map[string]string{signatureAnnotation: base64.StdEncoding.EncodeToString(sig)},
	}
}

// sigImage is cosign's signature image (its oci/empty.Signatures) with layers.
func sigImage(t testing.TB, layers ...mutate.Addendum) v1.Image {
	t.Helper()
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.Append(base, layers...)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// pushSigTag stores signatures as cosign does by default: in the image
// sha256-<hex>.sig of the repository.
func pushSigTag(t testing.TB, repo name.Repository, d digest.Digest, layers ...mutate.Addendum) {
	t.Helper()
	tag := repo.Tag(strings.Replace(d.String(), ":", "-", 1) + ".sig")
	if err := remote.Write(tag, sigImage(t, layers...)); err != nil {
		t.Fatal(err)
	}
}

// rawManifest is a manifest pushed byte for byte.
type rawManifest struct {
	raw []byte
	mt  types.MediaType
}

func (m rawManifest) RawManifest() ([]byte, error)        { return m.raw, nil }
func (m rawManifest) MediaType() (types.MediaType, error) { return m.mt, nil }

// pushSigReferrer stores signatures as cosign's
// --registry-referrers-mode=oci-1-1 does (WriteSignaturesExperimentalOCI): the
// signature image with the artifact type as config media type and
// artifactType, and the signed image as subject.
func pushSigReferrer(t testing.TB, repo name.Repository, subject digest.Digest, layers ...mutate.Addendum) {
	t.Helper()
	img := sigImage(t, layers...)
	ls, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		if err := remote.WriteLayer(repo, l); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := img.RawConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteLayer(repo, static.NewLayer(cfg, types.OCIConfigJSON)); err != nil {
		t.Fatal(err)
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	sub, err := remote.Head(repo.Digest(subject.String()))
	if err != nil {
		t.Fatal(err)
	}
	m = m.DeepCopy()
	m.Config.MediaType = signatureArtifactType
	m.ArtifactType = signatureArtifactType
	m.Subject = &v1.Descriptor{MediaType: sub.MediaType, Size: sub.Size, Digest: sub.Digest}
	raw, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	ref := repo.Digest(digest.FromBytes(raw).String())
	if err := remote.Put(ref, rawManifest{raw: raw, mt: types.OCIManifestSchema1}); err != nil {
		t.Fatal(err)
	}
}

// writePolicy writes a policy file in a test directory.
func writePolicy(t testing.TB, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "policy.json")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func mustParse(t testing.TB, policy string) *Policy {
	t.Helper()
	p, err := Parse([]byte(policy), "test-policy.json")
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return p
}

func mustNamed(t testing.TB, s string) reference.Named {
	t.Helper()
	n, err := reference.ParseNormalizedNamed(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// jsonString quotes s for a policy written as a Go string.
func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
