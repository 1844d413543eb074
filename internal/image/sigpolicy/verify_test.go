package sigpolicy

import (
	"context"
	"crypto"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/opencontainers/go-digest"
	"github.com/sigstore/sigstore/pkg/signature"
)

// env is one registry with a signed-or-not image team/app:1.36 and two keys.
type env struct {
	reg   *testRegistry
	repo  name.Repository
	d     digest.Digest // of team/app:1.36
	key   *testKey      // the trusted key of the default policy
	other *testKey      // a key the policy does not trust
}

func newEnv(t testing.TB, referrers bool) *env {
	t.Helper()
	e := &env{reg: newRegistry(t, referrers, nil), key: newECDSAKey(t), other: newECDSAKey(t)}
	e.repo = e.reg.repo(t, "team/app")
	e.d = pushImage(t, e.repo, "1.36")
	return e
}

// tagged is the image as pulled by tag.
func (e *env) tagged(t testing.TB) Image {
	return Image{Named: mustNamed(t, e.repo.Name()+":1.36"), Digest: e.d, Repository: e.repo}
}

// byDigest is the image as pulled by digest.
func (e *env) byDigest(t testing.TB) Image {
	return Image{Named: mustNamed(t, e.repo.Name()+"@"+e.d.String()), Digest: e.d, Repository: e.repo}
}

// exact is the identity `cosign sign --sign-container-identity` gives for the tag.
func (e *env) exact() string { return e.repo.Name() + ":1.36" }

// teamPolicy rejects by default and applies reqs to the registry's team namespace.
func (e *env) teamPolicy(reqs ...string) string {
	return fmt.Sprintf(`{"default":[{"type":"reject"}],"transports":{"docker":{%s:[%s]}}}`,
		jsonString(e.reg.host+"/team"), strings.Join(reqs, ","))
}

func keyPathReq(k *testKey, identity string) string {
	s := `{"type":"sigstoreSigned","keyPath":` + jsonString(k.pemPath)
	if identity != "" {
		s += `,"signedIdentity":` + identity
	}
	return s + "}"
}

func TestVerifySigstore(t *testing.T) {
	matchRepository := `{"type":"matchRepository"}`
	cases := []struct {
		name      string
		referrers bool
		// setup stores signatures and returns the policy and the image to check.
		setup func(t *testing.T, e *env) (policy string, img Image)
		want  string // "" when admitted, else part of the PermissionDenied message
	}{
		{
			name: "tag form, right key, exact identity",
			setup: func(t *testing.T, e *env) (string, Image) {
				pushSigTag(t, e.repo, e.d, sigLayer(t, e.key, cosignPayload(t, e.repo, e.d, e.exact())))
				return e.teamPolicy(keyPathReq(e.key, "")), e.tagged(t)
			},
		},
		{
			name:      "referrers API",
			referrers: true,
			setup: func(t *testing.T, e *env) (string, Image) {
				pushSigReferrer(t, e.repo, e.d, sigLayer(t, e.key, cosignPayload(t, e.repo, e.d, e.exact())))
				return e.teamPolicy(keyPathReq(e.key, "")), e.tagged(t)
			},
		},
		{
			name: "referrers fallback tag",
			setup: func(t *testing.T, e *env) (string, Image) {
				pushSigReferrer(t, e.repo, e.d, sigLayer(t, e.key, cosignPayload(t, e.repo, e.d, e.exact())))
				return e.teamPolicy(keyPathReq(e.key, "")), e.tagged(t)
			},
		},
		{
			name: "multi-platform index signed by its digest",
			setup: func(t *testing.T, e *env) (string, Image) {
				d := pushIndex(t, e.repo, "multi")
				pushSigTag(t, e.repo, d, sigLayer(t, e.key, cosignPayload(t, e.repo, d, e.repo.Name()+":multi")))
				return e.teamPolicy(keyPathReq(e.key, "")), Image{Named: mustNamed(t, e.repo.Name()+":multi"), Digest: d, Repository: e.repo}
			},
		},
		{
			name: "unsigned",
			setup: func(t *testing.T, e *env) (string, Image) {
				return e.teamPolicy(keyPathReq(e.key, "")), e.tagged(t)
			},
			want: "no signature found at %HOST%/team/app:sha256-",
		},
		{
			name:      "unsigned, registry with referrers API",
			referrers: true,
			setup: func(t *testing.T, e *env) (string, Image) {
				return e.teamPolicy(keyPathReq(e.key, "")), e.tagged(t)
			},
			want: ".sig or in the referrers of %HOST%/team/app@sha256:",
		},
		{
			name: "signed with another key",
			setup: func(t *testing.T, e *env) (string, Image) {
				pushSigTag(t, e.repo, e.d, sigLayer(t, e.other, cosignPayload(t, e.repo, e.d, e.exact())))
				return e.teamPolicy(keyPathReq(e.key, "")), e.tagged(t)
			},
			want: "signature does not verify with key %KEY%",
		},
		{
			name:      "referrer signed with another key",
			referrers: true,
			setup: func(t *testing.T, e *env) (string, Image) {
				pushSigReferrer(t, e.repo, e.d, sigLayer(t, e.other, cosignPayload(t, e.repo, e.d, e.exact())))
				return e.teamPolicy(keyPathReq(e.key, "")), e.tagged(t)
			},
			want: "signature does not verify with key %KEY%",
		},
		{
			name: "payload for another digest",
			setup: func(t *testing.T, e *env) (string, Image) {
				otherD := pushImage(t, e.repo, "other")
				pushSigTag(t, e.repo, e.d, sigLayer(t, e.key, cosignPayload(t, e.repo, otherD, e.exact())))
				return e.teamPolicy(keyPathReq(e.key, "")), e.tagged(t)
			},
			want: "is not the image's digest",
		},
		{
			name: "identity of another repository",
			setup: func(t *testing.T, e *env) (string, Image) {
				pushSigTag(t, e.repo, e.d, sigLayer(t, e.key, cosignPayload(t, e.repo, e.d, e.reg.host+"/team/other:1.36")))
				return e.teamPolicy(keyPathReq(e.key, "")), e.tagged(t)
			},
			want: `signed identity "%HOST%/team/other:1.36" does not match "%HOST%/team/app:1.36"`,
		},
		{
			name: "tag pull, signature of another tag",
			setup: func(t *testing.T, e *env) (string, Image) {
				pushSigTag(t, e.repo, e.d, sigLayer(t, e.key, cosignPayload(t, e.repo, e.d, e.repo.Name()+":latest")))
				return e.teamPolicy(keyPathReq(e.key, "")), e.tagged(t)
			},
			want: `signed identity "%HOST%/team/app:latest" does not match "%HOST%/team/app:1.36"`,
		},
		{
			name: "tag pull, signature of another tag, matchRepository",
			setup: func(t *testing.T, e *env) (string, Image) {
				pushSigTag(t, e.repo, e.d, sigLayer(t, e.key, cosignPayload(t, e.repo, e.d, e.repo.Name()+":latest")))
				return e.teamPolicy(keyPathReq(e.key, matchRepository)), e.tagged(t)
			},
		},
		{
			name: "tag pull, cosign's default identity, default signedIdentity",
			setup: func(t *testing.T, e *env) (string, Image) {
				pushSigTag(t, e.repo, e.d, sigLayer(t, e.key, cosignPayload(t, e.repo, e.d, "")))
				return e.teamPolicy(keyPathReq(e.key, "")), e.tagged(t)
			},
			want: "names a repository only, which signedIdentity matchRepoDigestOrExact never accepts",
		},
		{
			name: "tag pull, cosign's default identity, matchRepository",
			setup: func(t *testing.T, e *env) (string, Image) {
				pushSigTag(t, e.repo, e.d, sigLayer(t, e.key, cosignPayload(t, e.repo, e.d, "")))
				return e.teamPolicy(keyPathReq(e.key, matchRepository)), e.tagged(t)
			},
		},
		{
			name: "digest pull, signature of a tag of the repository",
			setup: func(t *testing.T, e *env) (string, Image) {
				pushSigTag(t, e.repo, e.d, sigLayer(t, e.key, cosignPayload(t, e.repo, e.d, e.repo.Name()+":any")))
				return e.teamPolicy(keyPathReq(e.key, "")), e.byDigest(t)
			},
		},
		{
			name: "digest pull, cosign's default identity, matchRepository",
			setup: func(t *testing.T, e *env) (string, Image) {
				pushSigTag(t, e.repo, e.d, sigLayer(t, e.key, cosignPayload(t, e.repo, e.d, "")))
				return e.teamPolicy(keyPathReq(e.key, matchRepository)), e.byDigest(t)
			},
		},
		{
			name: "digest pull, cosign's default identity, default signedIdentity",
			setup: func(t *testing.T, e *env) (string, Image) {
				pushSigTag(t, e.repo, e.d, sigLayer(t, e.key, cosignPayload(t, e.repo, e.d, "")))
				return e.teamPolicy(keyPathReq(e.key, "")), e.byDigest(t)
			},
			want: "names a repository only",
		},
		{
			name: "digest pull, signature of another repository",
			setup: func(t *testing.T, e *env) (string, Image) {
				pushSigTag(t, e.repo, e.d, sigLayer(t, e.key, cosignPayload(t, e.repo, e.d, e.reg.host+"/team/other:1.36")))
				return e.teamPolicy(keyPathReq(e.key, "")), e.byDigest(t)
			},
			want: `is not in repository "%HOST%/team/app"`,
		},
		{
			name: "digest in the reference differs from the resolved one",
			setup: func(t *testing.T, e *env) (string, Image) {
				otherD := pushImage(t, e.repo, "other")
				pushSigTag(t, e.repo, e.d, sigLayer(t, e.key, cosignPayload(t, e.repo, e.d, e.exact())))
				img := e.byDigest(t)
				img.Named = mustNamed(t, e.repo.Name()+"@"+otherD.String())
				return e.teamPolicy(keyPathReq(e.key, "")), img
			},
			want: "is not the resolved digest",
		},
		{
			name: "a bad signature and a good one",
			setup: func(t *testing.T, e *env) (string, Image) {
				pushSigTag(t, e.repo, e.d,
					sigLayer(t, e.other, cosignPayload(t, e.repo, e.d, e.exact())),
					sigLayer(t, e.key, cosignPayload(t, e.repo, e.d, e.exact())))
				return e.teamPolicy(keyPathReq(e.key, "")), e.tagged(t)
			},
		},
		{
			name:      "a bad signature in the tag, a good referrer",
			referrers: true,
			setup: func(t *testing.T, e *env) (string, Image) {
				pushSigTag(t, e.repo, e.d, sigLayer(t, e.other, cosignPayload(t, e.repo, e.d, e.exact())))
				pushSigReferrer(t, e.repo, e.d, sigLayer(t, e.key, cosignPayload(t, e.repo, e.d, e.exact())))
				return e.teamPolicy(keyPathReq(e.key, "")), e.tagged(t)
			},
		},
		{
			name: "two bad signatures",
			setup: func(t *testing.T, e *env) (string, Image) {
				pushSigTag(t, e.repo, e.d,
					sigLayer(t, e.other, cosignPayload(t, e.repo, e.d, e.exact())),
					sigLayer(t, e.key, cosignPayload(t, e.repo, e.d, e.reg.host+"/elsewhere:1.36")))
				return e.teamPolicy(keyPathReq(e.key, "")), e.tagged(t)
			},
			want: "none of the 2 signatures found is accepted: in %HOST%/team/app:sha256-",
		},
		{
			name: "keyPaths, signed by the second key",
			setup: func(t *testing.T, e *env) (string, Image) {
				pushSigTag(t, e.repo, e.d, sigLayer(t, e.key, cosignPayload(t, e.repo, e.d, e.exact())))
				return e.teamPolicy(fmt.Sprintf(`{"type":"sigstoreSigned","keyPaths":[%s,%s]}`,
					jsonString(e.other.pemPath), jsonString(e.key.pemPath))), e.tagged(t)
			},
		},
		{
			name: "keyPaths, signed by neither",
			setup: func(t *testing.T, e *env) (string, Image) {
				third := newECDSAKey(t)
				pushSigTag(t, e.repo, e.d, sigLayer(t, third, cosignPayload(t, e.repo, e.d, e.exact())))
				return e.teamPolicy(fmt.Sprintf(`{"type":"sigstoreSigned","keyPaths":[%s,%s]}`,
					jsonString(e.other.pemPath), jsonString(e.key.pemPath))), e.tagged(t)
			},
			want: "signature does not verify with any of the keys %OTHER%, %KEY%",
		},
		{
			name: "keyData",
			setup: func(t *testing.T, e *env) (string, Image) {
				pushSigTag(t, e.repo, e.d, sigLayer(t, e.key, cosignPayload(t, e.repo, e.d, e.exact())))
				return e.teamPolicy(fmt.Sprintf(`{"type":"sigstoreSigned","keyData":%q}`,
					base64.StdEncoding.EncodeToString(e.key.pem))), e.tagged(t)
			},
		},
		{
			name: "keyDatas",
			setup: func(t *testing.T, e *env) (string, Image) {
				pushSigTag(t, e.repo, e.d, sigLayer(t, e.key, cosignPayload(t, e.repo, e.d, e.exact())))
				return e.teamPolicy(fmt.Sprintf(`{"type":"sigstoreSigned","keyDatas":[%q,%q]}`,
					base64.StdEncoding.EncodeToString(e.other.pem), base64.StdEncoding.EncodeToString(e.key.pem))), e.tagged(t)
			},
		},
		{
			name: "payload changed after signing",
			setup: func(t *testing.T, e *env) (string, Image) {
				l := sigLayer(t, e.key, cosignPayload(t, e.repo, e.d, e.reg.host+"/team/other:1.36"))
				l.Layer = static.NewLayer(cosignPayload(t, e.repo, e.d, e.exact()), simpleSigningMediaType)
				pushSigTag(t, e.repo, e.d, l)
				return e.teamPolicy(keyPathReq(e.key, "")), e.tagged(t)
			},
			want: "signature does not verify with key %KEY%",
		},
		{
			name: "no signature annotation",
			setup: func(t *testing.T, e *env) (string, Image) {
				l := sigLayer(t, e.key, cosignPayload(t, e.repo, e.d, e.exact()))
				l.Annotations = nil
				pushSigTag(t, e.repo, e.d, l)
				return e.teamPolicy(keyPathReq(e.key, "")), e.tagged(t)
			},
			want: "has no dev.cosignproject.cosign/signature annotation",
		},
		{
			name: "signed payload of another type",
			setup: func(t *testing.T, e *env) (string, Image) {
				p := strings.Replace(string(cosignPayload(t, e.repo, e.d, e.exact())), "cosign container image signature", "atomic container signature", 1)
				pushSigTag(t, e.repo, e.d, sigLayer(t, e.key, []byte(p)))
				return e.teamPolicy(keyPathReq(e.key, "")), e.tagged(t)
			},
			want: `critical.type: "atomic container signature" is not "cosign container image signature"`,
		},
		{
			name: "signed payload with a duplicated key",
			setup: func(t *testing.T, e *env) (string, Image) {
				p := fmt.Sprintf(`{"critical":{"identity":{"docker-reference":%q},"image":{"docker-manifest-digest":%q},"type":"cosign container image signature","type":"x"},"optional":null}`,
					e.exact(), e.d)
				pushSigTag(t, e.repo, e.d, sigLayer(t, e.key, []byte(p)))
				return e.teamPolicy(keyPathReq(e.key, "")), e.tagged(t)
			},
			want: "critical.type: duplicate key",
		},
		{
			name: "signed payload with annotations",
			setup: func(t *testing.T, e *env) (string, Image) {
				p := fmt.Sprintf(`{"critical":{"identity":{"docker-reference":%q},"image":{"docker-manifest-digest":%q},"type":"cosign container image signature"},"optional":{"creator":"ci","n":1}}`,
					e.exact(), e.d)
				pushSigTag(t, e.repo, e.d, sigLayer(t, e.key, []byte(p)))
				return e.teamPolicy(keyPathReq(e.key, "")), e.tagged(t)
			},
		},
		{
			name: "all requirements apply: sigstoreSigned then reject",
			setup: func(t *testing.T, e *env) (string, Image) {
				pushSigTag(t, e.repo, e.d, sigLayer(t, e.key, cosignPayload(t, e.repo, e.d, e.exact())))
				return e.teamPolicy(keyPathReq(e.key, ""), `{"type":"reject"}`), e.tagged(t)
			},
			want: `requires reject (requirement 2 of 2): image rejected by "reject"`,
		},
		{
			name: "all requirements apply: two keys, signed by both",
			setup: func(t *testing.T, e *env) (string, Image) {
				pushSigTag(t, e.repo, e.d,
					sigLayer(t, e.key, cosignPayload(t, e.repo, e.d, e.exact())),
					sigLayer(t, e.other, cosignPayload(t, e.repo, e.d, e.exact())))
				return e.teamPolicy(keyPathReq(e.key, ""), keyPathReq(e.other, "")), e.tagged(t)
			},
		},
		{
			name: "all requirements apply: two keys, signed by one",
			setup: func(t *testing.T, e *env) (string, Image) {
				pushSigTag(t, e.repo, e.d, sigLayer(t, e.key, cosignPayload(t, e.repo, e.d, e.exact())))
				return e.teamPolicy(keyPathReq(e.key, ""), keyPathReq(e.other, "")), e.tagged(t)
			},
			want: "requires sigstoreSigned (requirement 2 of 2): in %HOST%/team/app:sha256-",
		},
		{
			name: "mirror: the upstream identity, signatures in the mirror",
			setup: func(t *testing.T, e *env) (string, Image) {
				mirror := e.reg.repo(t, "mirror/library/busybox")
				d := pushImage(t, mirror, "1.36")
				pushSigTag(t, mirror, d, sigLayer(t, e.key, cosignPayload(t, mirror, d, "docker.io/library/busybox:1.36")))
				policy := fmt.Sprintf(`{"default":[{"type":"reject"}],"transports":{"docker":{"docker.io/library/busybox":[%s]}}}`, keyPathReq(e.key, ""))
				return policy, Image{Named: mustNamed(t, "busybox:1.36"), Digest: d, Repository: mirror}
			},
		},
		{
			name: "mirror: signature of the mirror's own name",
			setup: func(t *testing.T, e *env) (string, Image) {
				mirror := e.reg.repo(t, "mirror/library/busybox")
				d := pushImage(t, mirror, "1.36")
				pushSigTag(t, mirror, d, sigLayer(t, e.key, cosignPayload(t, mirror, d, mirror.Name()+":1.36")))
				policy := fmt.Sprintf(`{"default":[{"type":"reject"}],"transports":{"docker":{"docker.io/library/busybox":[%s]}}}`, keyPathReq(e.key, ""))
				return policy, Image{Named: mustNamed(t, "busybox:1.36"), Digest: d, Repository: mirror}
			},
			want: `does not match "docker.io/library/busybox:1.36"`,
		},
		{
			name: "remapIdentity",
			setup: func(t *testing.T, e *env) (string, Image) {
				pushSigTag(t, e.repo, e.d, sigLayer(t, e.key, cosignPayload(t, e.repo, e.d, "vendor.example/products/app:1.36")))
				return e.teamPolicy(keyPathReq(e.key, fmt.Sprintf(`{"type":"remapIdentity","prefix":%s,"signedPrefix":"vendor.example/products"}`,
					jsonString(e.reg.host+"/team")))), e.tagged(t)
			},
		},
		{
			name: "remapIdentity, signature of another vendor repository",
			setup: func(t *testing.T, e *env) (string, Image) {
				pushSigTag(t, e.repo, e.d, sigLayer(t, e.key, cosignPayload(t, e.repo, e.d, "vendor.example/products/other:1.36")))
				return e.teamPolicy(keyPathReq(e.key, fmt.Sprintf(`{"type":"remapIdentity","prefix":%s,"signedPrefix":"vendor.example/products"}`,
					jsonString(e.reg.host+"/team")))), e.tagged(t)
			},
			want: `does not match "vendor.example/products/app:1.36" (signedIdentity remapIdentity)`,
		},
		{
			name: "exactReference",
			setup: func(t *testing.T, e *env) (string, Image) {
				pushSigTag(t, e.repo, e.d, sigLayer(t, e.key, cosignPayload(t, e.repo, e.d, "vendor.example/app:2")))
				return e.teamPolicy(keyPathReq(e.key, `{"type":"exactReference","dockerReference":"vendor.example/app:2"}`)), e.tagged(t)
			},
		},
		{
			name: "exactRepository with another repository",
			setup: func(t *testing.T, e *env) (string, Image) {
				pushSigTag(t, e.repo, e.d, sigLayer(t, e.key, cosignPayload(t, e.repo, e.d, "vendor.example/app:2")))
				return e.teamPolicy(keyPathReq(e.key, `{"type":"exactRepository","dockerRepository":"vendor.example/other"}`)), e.tagged(t)
			},
			want: `signed identity "vendor.example/app:2" does not match "vendor.example/other" (signedIdentity exactRepository)`,
		},
		{
			name: "matchExact, digest pull, signature of the tag",
			setup: func(t *testing.T, e *env) (string, Image) {
				pushSigTag(t, e.repo, e.d, sigLayer(t, e.key, cosignPayload(t, e.repo, e.d, e.exact())))
				return e.teamPolicy(keyPathReq(e.key, `{"type":"matchExact"}`)), e.byDigest(t)
			},
			want: "(signedIdentity matchExact)",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.referrers)
			policy, img := tc.setup(t, e)
			p := mustParse(t, policy)
			err := p.Verify(context.Background(), img)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Verify = %v, want the image admitted", err)
				}
				return
			}
			t.Logf("Verify: %v", err)
			want := strings.NewReplacer("%HOST%", e.reg.host, "%KEY%", e.key.pemPath, "%OTHER%", e.other.pemPath).Replace(tc.want)
			if err == nil {
				t.Fatalf("Verify admitted the image, want a refusal with %q", want)
			}
			if !errdefs.IsPermissionDenied(err) {
				t.Errorf("Verify = %v, want a PermissionDenied error", err)
			}
			if !strings.Contains(err.Error(), want) {
				t.Errorf("Verify = %v\nwant it to contain %q", err, want)
			}
			if !strings.Contains(err.Error(), img.Named.String()) {
				t.Errorf("Verify = %v, want it to name the image %s", err, img.Named)
			}
		})
	}
}

func TestVerifyRefusalNamesScope(t *testing.T) {
	e := newEnv(t, false)
	p := mustParse(t, e.teamPolicy(keyPathReq(e.key, "")))
	err := p.Verify(context.Background(), e.tagged(t))
	want := fmt.Sprintf(`rejected by signature policy test-policy.json: transports.docker[%q] requires sigstoreSigned: no signature found`, e.reg.host+"/team")
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Verify = %v, want %q in it", err, want)
	}
}

func TestVerifyKeyTypes(t *testing.T) {
	newKey := func(t *testing.T, kind string) *testKey {
		switch kind {
		case "P-384, SHA-384":
			return newECDSAKeyOn(t, elliptic.P384(), crypto.SHA384)
		case "P-384, SHA-256":
			return newECDSAKeyOn(t, elliptic.P384(), crypto.SHA256)
		case "P-521, SHA-512":
			return newECDSAKeyOn(t, elliptic.P521(), crypto.SHA512)
		case "RSA-2048":
			priv, err := rsa.GenerateKey(rand.Reader, 2048)
			if err != nil {
				t.Fatal(err)
			}
			sv, err := signature.LoadRSAPKCS1v15SignerVerifier(priv, crypto.SHA256)
			if err != nil {
				t.Fatal(err)
			}
			return writeKey(t, priv.Public(), sv)
		case "Ed25519":
			pub, priv, err := ed25519.GenerateKey(rand.Reader)
			if err != nil {
				t.Fatal(err)
			}
			sv, err := signature.LoadED25519SignerVerifier(priv)
			if err != nil {
				t.Fatal(err)
			}
			return writeKey(t, pub, sv)
		}
		t.Fatalf("no key kind %s", kind)
		return nil
	}
	e := newEnv(t, false)
	for _, kind := range []string{"P-384, SHA-384", "P-384, SHA-256", "P-521, SHA-512", "RSA-2048", "Ed25519"} {
		t.Run(kind, func(t *testing.T) {
			k := newKey(t, kind)
			repo := e.reg.repo(t, "keys/"+strings.NewReplacer(",", "", " ", "-").Replace(strings.ToLower(kind)))
			d := pushImage(t, repo, "v1")
			pushSigTag(t, repo, d, sigLayer(t, k, cosignPayload(t, repo, d, repo.Name()+":v1")))
			img := Image{Named: mustNamed(t, repo.Name()+":v1"), Digest: d, Repository: repo}

			p := mustParse(t, fmt.Sprintf(`{"default":[%s]}`, keyPathReq(k, "")))
			if err := p.Verify(context.Background(), img); err != nil {
				t.Errorf("Verify with the signing key = %v, want nil", err)
			}
			p = mustParse(t, fmt.Sprintf(`{"default":[%s]}`, keyPathReq(e.key, "")))
			if err := p.Verify(context.Background(), img); !errdefs.IsPermissionDenied(err) {
				t.Errorf("Verify with another key = %v, want PermissionDenied", err)
			}
		})
	}
}

func TestVerifyAcceptAndReject(t *testing.T) {
	// No registry: these requirements must not need one.
	img := Image{Named: mustNamed(t, "registry.example/team/app:1"), Digest: digest.FromString("x")}
	cases := []struct {
		name, policy string
		want         string // "" when admitted
	}{
		{name: "accept anything", policy: `{"default":[{"type":"insecureAcceptAnything"}]}`},
		{name: "reject by default", policy: `{"default":[{"type":"reject"}]}`,
			want: `image registry.example/team/app:1 rejected by signature policy test-policy.json: default requires reject: image rejected by "reject"`},
		{name: "reject in a scope", policy: `{"default":[{"type":"insecureAcceptAnything"}],"transports":{"docker":{"registry.example/team":[{"type":"reject"}]}}}`,
			want: `transports.docker["registry.example/team"] requires reject: image rejected by "reject"`},
		{name: "accept in a scope", policy: `{"default":[{"type":"reject"}],"transports":{"docker":{"registry.example/team":[{"type":"insecureAcceptAnything"}]}}}`},
		{name: "accept then reject", policy: `{"default":[{"type":"insecureAcceptAnything"},{"type":"reject"}]}`,
			want: `default requires reject (requirement 2 of 2)`},
		{name: "other transports do not apply", policy: `{"default":[{"type":"insecureAcceptAnything"}],"transports":{"docker-daemon":{"":[{"type":"reject"}]}}}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := mustParse(t, tc.policy).Verify(context.Background(), img)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Verify = %v, want nil", err)
			case tc.want == "":
			case err == nil:
				t.Fatalf("Verify = nil, want %q", tc.want)
			case !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), tc.want):
				t.Fatalf("Verify = %v, want a PermissionDenied error with %q", err, tc.want)
			}
		})
	}
}

func TestVerifyUnavailable(t *testing.T) {
	t.Run("registry down", func(t *testing.T) {
		e := newEnv(t, false)
		p := mustParse(t, e.teamPolicy(keyPathReq(e.key, "")))
		e.reg.srv.Close()
		err := p.Verify(context.Background(), e.tagged(t))
		if !errdefs.IsUnavailable(err) || errdefs.IsPermissionDenied(err) {
			t.Fatalf("Verify = %v, want Unavailable", err)
		}
	})
	t.Run("server error on the signature tag", func(t *testing.T) {
		key := newECDSAKey(t)
		reg := newRegistry(t, false, func(h http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if strings.HasSuffix(r.URL.Path, ".sig") {
					http.Error(w, "boom", http.StatusInternalServerError)
					return
				}
				h.ServeHTTP(w, r)
			})
		})
		repo := reg.repo(t, "team/app")
		d := pushImage(t, repo, "1")
		p := mustParse(t, fmt.Sprintf(`{"default":[%s]}`, keyPathReq(key, "")))
		err := p.Verify(context.Background(), Image{Named: mustNamed(t, repo.Name()+":1"), Digest: d, Repository: repo})
		if !errdefs.IsUnavailable(err) || errdefs.IsPermissionDenied(err) {
			t.Fatalf("Verify = %v, want Unavailable", err)
		}
		t.Logf("Verify: %v", err)
		if !strings.Contains(err.Error(), "500") {
			t.Errorf("Verify = %v, want the registry's status in it", err)
		}
	})
}

func TestVerifyContextCancelled(t *testing.T) {
	t.Run("before", func(t *testing.T) {
		e := newEnv(t, false)
		p := mustParse(t, e.teamPolicy(keyPathReq(e.key, "")))
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		err := p.Verify(ctx, e.tagged(t))
		if !errors.Is(err, context.Canceled) || errdefs.IsPermissionDenied(err) || errdefs.IsUnavailable(err) {
			t.Fatalf("Verify = %v, want context.Canceled only", err)
		}
	})
	t.Run("while fetching", func(t *testing.T) {
		key := newECDSAKey(t)
		arrived := make(chan struct{}, 1)
		reg := newRegistry(t, false, func(h http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if strings.HasSuffix(r.URL.Path, ".sig") {
					arrived <- struct{}{}
					<-r.Context().Done() // a registry that never answers
					return
				}
				h.ServeHTTP(w, r)
			})
		})
		repo := reg.repo(t, "team/app")
		d := pushImage(t, repo, "1")
		p := mustParse(t, fmt.Sprintf(`{"default":[%s]}`, keyPathReq(key, "")))
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			<-arrived
			cancel()
		}()
		start := time.Now()
		err := p.Verify(ctx, Image{Named: mustNamed(t, repo.Name()+":1"), Digest: d, Repository: repo})
		if !errors.Is(err, context.Canceled) || errdefs.IsPermissionDenied(err) || errdefs.IsUnavailable(err) {
			t.Fatalf("Verify = %v, want context.Canceled only", err)
		}
		if elapsed := time.Since(start); elapsed > 10*time.Second {
			t.Errorf("Verify took %v to notice the cancellation", elapsed)
		}
	})
}

func TestVerifyBounds(t *testing.T) {
	t.Run("at most 64 signatures", func(t *testing.T) {
		e := newEnv(t, true)
		var bad []mutate.Addendum
		for range maxSignatures + 6 {
			bad = append(bad, sigLayer(t, e.other, cosignPayload(t, e.repo, e.d, e.exact())))
		}
		pushSigTag(t, e.repo, e.d, bad...)
		// A good signature past the bound is not looked at.
		pushSigReferrer(t, e.repo, e.d, sigLayer(t, e.key, cosignPayload(t, e.repo, e.d, e.exact())))
		err := mustParse(t, e.teamPolicy(keyPathReq(e.key, ""))).Verify(context.Background(), e.tagged(t))
		if !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), "only the first 64 signatures were considered") ||
			!strings.Contains(err.Error(), "none of the 64 signatures") {
			t.Fatalf("Verify = %v, want a refusal after 64 signatures", err)
		}
	})
	t.Run("oversized signature manifest", func(t *testing.T) {
		key := newECDSAKey(t)
		reg := newRegistry(t, false, func(h http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if strings.HasSuffix(r.URL.Path, ".sig") {
					w.Header().Set("Content-Type", string(types.OCIManifestSchema1))
					_, _ = w.Write([]byte(`{"schemaVersion":2,"layers":[],"annotations":{"x":"`))
					_, _ = w.Write(make([]byte, maxManifestSize)) // and never the end: bounded before
					return
				}
				h.ServeHTTP(w, r)
			})
		})
		repo := reg.repo(t, "team/app")
		d := pushImage(t, repo, "1")
		err := mustParse(t, fmt.Sprintf(`{"default":[%s]}`, keyPathReq(key, ""))).Verify(context.Background(),
			Image{Named: mustNamed(t, repo.Name()+":1"), Digest: d, Repository: repo})
		if !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), "response too large") {
			t.Fatalf("Verify = %v, want a refusal naming the oversized manifest", err)
		}
	})
	t.Run("oversized payload", func(t *testing.T) {
		e := newEnv(t, false)
		// A manifest announcing a payload over the bound: never downloaded.
		big := v1.Descriptor{MediaType: simpleSigningMediaType, Size: maxPayloadSize + 1,
			Digest:      v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("a", 64)},
			Annotations: map[string]string{signatureAnnotation: "AAAA"}}
		m := v1.Manifest{SchemaVersion: 2, MediaType: types.OCIManifestSchema1,
			Config: v1.Descriptor{MediaType: types.OCIConfigJSON, Size: 2, Digest: v1.Hash{Algorithm: "sha256", Hex: digest.FromString("{}").Encoded()}},
			Layers: []v1.Descriptor{big}}
		raw, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if err := remote.WriteLayer(e.repo, static.NewLayer([]byte("{}"), types.OCIConfigJSON)); err != nil {
			t.Fatal(err)
		}
		tag := e.repo.Tag(strings.Replace(e.d.String(), ":", "-", 1) + ".sig")
		if err := remote.Put(tag, rawManifest{raw: raw, mt: types.OCIManifestSchema1}); err != nil {
			t.Fatal(err)
		}
		err = mustParse(t, e.teamPolicy(keyPathReq(e.key, ""))).Verify(context.Background(), e.tagged(t))
		if !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), "is larger than the 4194304 allowed") {
			t.Fatalf("Verify = %v, want a refusal of the oversized payload", err)
		}
	})
}

func TestVerifyInvalidImage(t *testing.T) {
	p := mustParse(t, fmt.Sprintf(`{"default":[%s]}`, keyPathReq(newECDSAKey(t), "")))
	if err := p.Verify(context.Background(), Image{}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Verify(no name) = %v, want InvalidArgument", err)
	}
	img := Image{Named: mustNamed(t, "registry.example/app:1")}
	if err := p.Verify(context.Background(), img); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Verify(no digest) = %v, want InvalidArgument", err)
	}
	img.Digest = digest.FromString("x")
	if err := p.Verify(context.Background(), img); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Verify(no repository) = %v, want InvalidArgument", err)
	}
}

func BenchmarkVerify(b *testing.B) {
	e := newEnv(b, false)
	pushSigTag(b, e.repo, e.d, sigLayer(b, e.key, cosignPayload(b, e.repo, e.d, e.exact())))
	p := mustParse(b, e.teamPolicy(keyPathReq(e.key, "")))
	img := e.tagged(b)
	ctx := context.Background()
	for b.Loop() {
		if err := p.Verify(ctx, img); err != nil {
			b.Fatal(err)
		}
	}
}
