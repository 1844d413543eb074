package sigpolicy

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
)

func TestLoadErrors(t *testing.T) {
	key := newECDSAKey(t)
	keyPath := jsonString(key.pemPath)
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "not-pem.pub")
	if err := os.WriteFile(notPEM, []byte("ssh-ed25519 AAAA me@host\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	twoKeys := filepath.Join(dir, "two.pub")
	if err := os.WriteFile(twoKeys, append(append([]byte{}, key.pem...), newECDSAKey(t).pem...), 0o600); err != nil {
		t.Fatal(err)
	}
	weak, err := rsa.GenerateKey(rand.Reader, 1024) //nolint:gosec // a weak key, to see it refused
	if err != nil {
		t.Fatal(err)
	}
	weakKey := writeKey(t, weak.Public(), nil)

	cases := []struct {
		name, policy string
		want         string // part of the error, after the file name
	}{
		{name: "bad JSON", policy: "{\n  \"default\": [}\n",
			want: "invalid JSON at line 2, column"},
		{name: "trailing data", policy: `{"default":[{"type":"reject"}]} {}`,
			want: "invalid JSON"},
		{name: "not an object", policy: `[]`,
			want: "must be a JSON object, not a list"},
		{name: "missing default", policy: `{"transports":{}}`,
			want: "default: missing: the global default list of requirements is mandatory"},
		{name: "empty default", policy: `{"default":[]}`,
			want: "default: the list of requirements must not be empty"},
		{name: "default not a list", policy: `{"default":{"type":"reject"}}`,
			want: "default: must be a list of requirements, not an object"},
		{name: "duplicate key", policy: `{"default":[{"type":"reject"}],"default":[{"type":"insecureAcceptAnything"}]}`,
			want: "default: duplicate key"},
		{name: "unknown top-level field", policy: `{"default":[{"type":"reject"}],"transport":{}}`,
			want: `unknown top-level field "transport"`},
		{name: "transports not an object", policy: `{"default":[{"type":"reject"}],"transports":[]}`,
			want: "transports: must be a JSON object, not a list"},
		{name: "empty scope", policy: `{"default":[{"type":"reject"}],"transports":{"docker":{"example.com":[]}}}`,
			want: `transports.docker["example.com"]: the list of requirements must not be empty`},
		{name: "signedBy", policy: `{"default":[{"type":"reject"}],"transports":{"docker":{"registry.example/team":[{"type":"signedBy","keyType":"GPGKeys","keyPath":"/etc/pki/gpg"}]}}}`,
			want: `transports.docker["registry.example/team"][0]: requirement type "signedBy" (GPG simple signing) is not supported by crisp`},
		{name: "signedBy as default", policy: `{"default":[{"type":"signedBy","keyType":"GPGKeys","keyPath":"/etc/pki/gpg"}]}`,
			want: `default[0]: requirement type "signedBy" (GPG simple signing) is not supported by crisp`},
		{name: "signedBaseLayer", policy: `{"default":[{"type":"signedBaseLayer","baseLayerIdentity":{"type":"matchExact"}}]}`,
			want: `default[0]: requirement type "signedBaseLayer" is not supported by crisp`},
		{name: "fulcio", policy: `{"default":[{"type":"sigstoreSigned","fulcio":{"caPath":"/ca.pem","oidcIssuer":"https://issuer","subjectEmail":"a@b"},"rekorPublicKeyPath":"/rekor.pub"}]}`,
			want: `default[0].fulcio: sigstoreSigned with "fulcio" (keyless signatures with Fulcio certificates) is not supported by crisp`},
		{name: "pki", policy: `{"default":[{"type":"sigstoreSigned","pki":{"caRootsPath":"/roots.pem","subjectEmail":"a@b"}}]}`,
			want: `default[0].pki: sigstoreSigned with "pki" (X.509 certificate signatures) is not supported by crisp`},
		{name: "rekor key with a public key", policy: `{"default":[{"type":"sigstoreSigned","keyPath":` + keyPath + `,"rekorPublicKeyPath":"/rekor.pub"}]}`,
			want: `default[0].rekorPublicKeyPath: sigstoreSigned with "rekorPublicKeyPath" (Rekor transparency log verification) is not supported by crisp`},
		{name: "relative keyPath", policy: `{"default":[{"type":"sigstoreSigned","keyPath":"keys/cosign.pub"}]}`,
			want: `default[0].keyPath: key file "keys/cosign.pub" is not an absolute path`},
		{name: "relative entry of keyPaths", policy: `{"default":[{"type":"sigstoreSigned","keyPaths":[` + keyPath + `,"cosign.pub"]}]}`,
			want: `default[0].keyPaths[1]: key file "cosign.pub" is not an absolute path`},
		{name: "unreadable key", policy: `{"default":[{"type":"sigstoreSigned","keyPath":"/nonexistent/cosign.pub"}]}`,
			want: "default[0].keyPath: reading public key: open /nonexistent/cosign.pub: no such file or directory"},
		{name: "key that is not PEM", policy: `{"default":[{"type":"sigstoreSigned","keyPath":` + jsonString(notPEM) + `}]}`,
			want: "default[0].keyPath: public key " + notPEM + ": no PEM block found"},
		{name: "two keys in one file", policy: `{"default":[{"type":"sigstoreSigned","keyPath":` + jsonString(twoKeys) + `}]}`,
			want: "default[0].keyPath: public key " + twoKeys + ": more than one PEM block"},
		{name: "weak RSA key", policy: `{"default":[{"type":"sigstoreSigned","keyPath":` + jsonString(weakKey.pemPath) + `}]}`,
			want: "public key " + weakKey.pemPath + ": RSA key of 1024 bits is too weak"},
		{name: "keyData that is not a key", policy: `{"default":[{"type":"sigstoreSigned","keyData":"` + base64.StdEncoding.EncodeToString([]byte("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")) + `"}]}`,
			want: "default[0].keyData: public key: asn1: structure error"},
		{name: "keyData not base64", policy: `{"default":[{"type":"sigstoreSigned","keyData":"%%%"}]}`,
			want: "default[0].keyData: illegal base64 data"},
		{name: "keyPath not a string", policy: `{"default":[{"type":"sigstoreSigned","keyPath":7}]}`,
			want: "default[0].keyPath: number where a string is expected"},
		{name: "empty keyPaths", policy: `{"default":[{"type":"sigstoreSigned","keyPaths":[]}]}`,
			want: "default[0].keyPaths: must not be empty"},
		{name: "empty keyDatas", policy: `{"default":[{"type":"sigstoreSigned","keyDatas":[]}]}`,
			want: "default[0].keyDatas: must not be empty"},
		{name: "no key", policy: `{"default":[{"type":"sigstoreSigned"}]}`,
			want: "default[0]: exactly one of keyPath, keyPaths, keyData and keyDatas must be present, found 0"},
		{name: "two key sources", policy: `{"default":[{"type":"sigstoreSigned","keyPath":` + keyPath + `,"keyPaths":[` + keyPath + `]}]}`,
			want: "default[0]: exactly one of keyPath, keyPaths, keyData and keyDatas must be present, found 2"},
		{name: "unknown type", policy: `{"default":[{"type":"acceptEverything"}]}`,
			want: `default[0].type: unknown requirement type "acceptEverything"`},
		{name: "missing type", policy: `{"default":[{"keyPath":"/k.pub"}]}`,
			want: `default[0].type: missing`},
		{name: "type not a string", policy: `{"default":[{"type":1}]}`,
			want: `default[0].type: number where a string is expected`},
		{name: "requirement not an object", policy: `{"default":["reject"]}`,
			want: `default[0]: must be a JSON object, not a string`},
		{name: "unknown field of reject", policy: `{"default":[{"type":"reject","keyPath":"/k.pub"}]}`,
			want: `default[0].keyPath: unknown field "keyPath" in a reject requirement`},
		{name: "unknown field of sigstoreSigned", policy: `{"default":[{"type":"sigstoreSigned","keypath":` + keyPath + `}]}`,
			want: `default[0].keypath: unknown field "keypath" in a sigstoreSigned requirement`},
		{name: "unknown signedIdentity type", policy: `{"default":[{"type":"sigstoreSigned","keyPath":` + keyPath + `,"signedIdentity":{"type":"matchAnything"}}]}`,
			want: `default[0].signedIdentity.type: unknown signedIdentity type "matchAnything"`},
		{name: "unknown signedIdentity field", policy: `{"default":[{"type":"sigstoreSigned","keyPath":` + keyPath + `,"signedIdentity":{"type":"matchExact","dockerReference":"a/b:1"}}]}`,
			want: `default[0].signedIdentity.dockerReference: unknown field "dockerReference" in a matchExact signedIdentity`},
		{name: "exactReference without reference", policy: `{"default":[{"type":"sigstoreSigned","keyPath":` + keyPath + `,"signedIdentity":{"type":"exactReference"}}]}`,
			want: `default[0].signedIdentity.dockerReference: missing (required by exactReference)`},
		{name: "exactReference without tag", policy: `{"default":[{"type":"sigstoreSigned","keyPath":` + keyPath + `,"signedIdentity":{"type":"exactReference","dockerReference":"example.com/app"}}]}`,
			want: `default[0].signedIdentity.dockerReference: "example.com/app" has neither a tag nor a digest`},
		{name: "exactRepository invalid", policy: `{"default":[{"type":"sigstoreSigned","keyPath":` + keyPath + `,"signedIdentity":{"type":"exactRepository","dockerRepository":"Example.com/App"}}]}`,
			want: `default[0].signedIdentity.dockerRepository: invalid repository "Example.com/App"`},
		{name: "remapIdentity invalid prefix", policy: `{"default":[{"type":"sigstoreSigned","keyPath":` + keyPath + `,"signedIdentity":{"type":"remapIdentity","prefix":"example.com/app:1","signedPrefix":"example.org"}}]}`,
			want: `default[0].signedIdentity.prefix: prefix "example.com/app:1" is neither a host[:port] nor a host[:port]/namespace`},
		{name: "unknown type in an ignored transport", policy: `{"default":[{"type":"reject"}],"transports":{"oci":{"":[{"type":"acceptAll"}]}}}`,
			want: `transports.oci[""][0].type: unknown requirement type "acceptAll"`},
		{name: "empty list in an ignored transport", policy: `{"default":[{"type":"reject"}],"transports":{"docker-daemon":{"":[]}}}`,
			want: `transports["docker-daemon"][""]: the list of requirements must not be empty`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := writePolicy(t, tc.policy)
			p, err := Load(path)
			if err == nil {
				t.Fatalf("Load = %v, want an error with %q", p, tc.want)
			}
			t.Logf("Load: %v", err)
			prefix := "signature policy " + path + ": "
			if !strings.HasPrefix(err.Error(), prefix) {
				t.Errorf("Load = %v, want it to start with %q", err, prefix)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Load = %v\nwant it to contain %q", err, tc.want)
			}
		})
	}
}

func TestLoadMissingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.json")
	_, err := Load(path)
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), path) {
		t.Fatalf("Load = %v, want a not-found error naming %s", err, path)
	}
}

func TestLoadAcceptsContainersPolicy(t *testing.T) {
	key := newECDSAKey(t)
	// A policy as podman users write it: other transports, with requirements
	// crisp does not evaluate there, are accepted and ignored.
	policy := `{
    "default": [{"type": "reject"}],
    "transports": {
        "docker": {
            "docker.io/library/busybox": [{"type": "insecureAcceptAnything"}],
            "*.temporary-project.example.com": [{"type": "insecureAcceptAnything"}],
            "hostname:5000/myns/sigstore-signed-with-full-references": [
                {"type": "sigstoreSigned", "keyPath": ` + jsonString(key.pemPath) + `}
            ],
            "hostname:5000/myns/sigstore-signed-allows-malicious-tag-substitution": [
                {"type": "sigstoreSigned", "keyPath": ` + jsonString(key.pemPath) + `, "signedIdentity": {"type": "matchRepository"}}
            ],
            "private-mirror:5000/vendor-mirror": [
                {"type": "sigstoreSigned", "keyData": "` + base64.StdEncoding.EncodeToString(key.pem) + `",
                 "signedIdentity": {"type": "remapIdentity", "prefix": "private-mirror:5000/vendor-mirror", "signedPrefix": "vendor.example.com"}}
            ],
            "hostname:5000/vendor/product": [
                {"type": "sigstoreSigned", "keyPaths": [` + jsonString(key.pemPath) + `],
                 "signedIdentity": {"type": "exactRepository", "dockerRepository": "vendor-hostname/product/repository"}}
            ]
        },
        "dir": {"": [{"type": "insecureAcceptAnything"}]},
        "atomic": {
            "hostname:5000/myns/official": [{"type": "signedBy", "keyType": "GPGKeys", "keyPath": "/path/to/official-pubkey.gpg"}]
        },
        "docker-daemon": {"": [{"type": "insecureAcceptAnything"}]}
    }
}`
	p, err := Load(writePolicy(t, policy))
	if err != nil {
		t.Fatalf("Load = %v", err)
	}
	if got, want := p.Describe(mustNamed(t, "hostname:5000/myns/sigstore-signed-with-full-references:1")),
		`sigstoreSigned (scope "hostname:5000/myns/sigstore-signed-with-full-references")`; got != want {
		t.Errorf("Describe = %q, want %q", got, want)
	}
}

func TestScopePrecedence(t *testing.T) {
	const dig = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	scopes := []string{
		"",
		"*.example.com",
		"*.team.example.com",
		"registry.team.example.com",
		"registry.team.example.com/ns",
		"registry.team.example.com/ns/sub",
		"registry.team.example.com/ns/sub/app",
		"registry.team.example.com/ns/sub/app:1.0",
		"registry.team.example.com/ns/sub/app@" + dig,
		"docker.io/library",
		"docker.io/library/busybox",
		"localhost:5000",
		"*.port.example",
	}
	var entries []string
	for _, s := range scopes {
		entries = append(entries, fmt.Sprintf(`%s:[{"type":"reject"}]`, jsonString(s)))
	}
	p := mustParse(t, `{"default":[{"type":"insecureAcceptAnything"}],"transports":{"docker":{`+strings.Join(entries, ",")+`}}}`)

	cases := []struct{ image, scope string }{
		{"registry.team.example.com/ns/sub/app:1.0", "registry.team.example.com/ns/sub/app:1.0"},
		{"registry.team.example.com/ns/sub/app:2.0", "registry.team.example.com/ns/sub/app"},
		{"registry.team.example.com/ns/sub/app", "registry.team.example.com/ns/sub/app"},
		{"registry.team.example.com/ns/sub/app@" + dig, "registry.team.example.com/ns/sub/app@" + dig},
		// A tag and a digest: the digest is what is pulled.
		{"registry.team.example.com/ns/sub/app:1.0@" + dig, "registry.team.example.com/ns/sub/app@" + dig},
		{"registry.team.example.com/ns/sub/other:1", "registry.team.example.com/ns/sub"},
		{"registry.team.example.com/ns/subway/app:1", "registry.team.example.com/ns"},
		{"registry.team.example.com/other:1", "registry.team.example.com"},
		{"mirror.team.example.com/ns/sub/app:1.0", "*.team.example.com"},
		{"a.b.example.com/app:1", "*.example.com"},
		// Wildcards match subdomains only.
		{"example.com/app:1", ""},
		{"team.example.com/app:1", "*.example.com"},
		{"busybox", "docker.io/library/busybox"},
		{"busybox:1.36", "docker.io/library/busybox"},
		{"docker.io/library/busybox@" + dig, "docker.io/library/busybox"},
		{"alpine:3", "docker.io/library"},
		{"someone/busybox:1", ""},
		{"localhost:5000/app:1", "localhost:5000"},
		{"localhost:5001/app:1", ""},
		// The port is not part of a wildcard match.
		{"reg.port.example:5000/app:1", "*.port.example"},
		{"quay.io/app:1", ""},
	}
	for _, tc := range cases {
		t.Run(tc.image, func(t *testing.T) {
			named := mustNamed(t, tc.image)
			want := fmt.Sprintf(`reject (scope %q)`, tc.scope)
			if got := p.Describe(named); got != want {
				t.Errorf("Describe = %q, want %q", got, want)
			}
			err := p.Verify(context.Background(), Image{Named: named, Digest: digest.Digest(dig)})
			wantPath := fmt.Sprintf(`transports.docker[%q] requires reject`, tc.scope)
			if !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), wantPath) {
				t.Errorf("Verify = %v, want a refusal by %s", err, wantPath)
			}
		})
	}

	t.Run("no transports", func(t *testing.T) {
		p := mustParse(t, `{"default":[{"type":"reject"}]}`)
		if got, want := p.Describe(mustNamed(t, "busybox")), "reject (default)"; got != want {
			t.Errorf("Describe = %q, want %q", got, want)
		}
	})
	t.Run("docker without a transport default", func(t *testing.T) {
		p := mustParse(t, `{"default":[{"type":"reject"}],"transports":{"docker":{"quay.io":[{"type":"insecureAcceptAnything"}]}}}`)
		if got, want := p.Describe(mustNamed(t, "busybox")), "reject (default)"; got != want {
			t.Errorf("Describe = %q, want %q", got, want)
		}
		if got, want := p.Describe(mustNamed(t, "quay.io/app")), `insecureAcceptAnything (scope "quay.io")`; got != want {
			t.Errorf("Describe = %q, want %q", got, want)
		}
	})
	t.Run("other transports are ignored", func(t *testing.T) {
		p := mustParse(t, `{"default":[{"type":"insecureAcceptAnything"}],"transports":{"docker-daemon":{"":[{"type":"reject"}]},"oci":{"":[{"type":"reject"}]}}}`)
		if got, want := p.Describe(mustNamed(t, "busybox")), "insecureAcceptAnything (default)"; got != want {
			t.Errorf("Describe = %q, want %q", got, want)
		}
	})
	t.Run("several requirements", func(t *testing.T) {
		key := newECDSAKey(t)
		p := mustParse(t, `{"default":[{"type":"reject"}],"transports":{"docker":{"registry.example/team":[`+keyPathReq(key, "")+`,{"type":"insecureAcceptAnything"}]}}}`)
		if got, want := p.Describe(mustNamed(t, "registry.example/team/app")), `sigstoreSigned, insecureAcceptAnything (scope "registry.example/team")`; got != want {
			t.Errorf("Describe = %q, want %q", got, want)
		}
	})
}

func TestIdentityMatch(t *testing.T) {
	const dig = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	rule := func(t *testing.T, js string) identityRule {
		t.Helper()
		r, err := parseIdentity([]byte(js), "signedIdentity")
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	cases := []struct {
		rule, image, signed string
		want                bool
	}{
		// matchRepoDigestOrExact
		{`{"type":"matchRepoDigestOrExact"}`, "example.com/app:1", "example.com/app:1", true},
		{`{"type":"matchRepoDigestOrExact"}`, "busybox:1.36", "docker.io/library/busybox:1.36", true},
		{`{"type":"matchRepoDigestOrExact"}`, "docker.io/library/busybox:1.36", "busybox:1.36", true},
		{`{"type":"matchRepoDigestOrExact"}`, "example.com/app:1", "example.com/app:2", false},
		{`{"type":"matchRepoDigestOrExact"}`, "example.com/app:1", "example.com/app", false},
		{`{"type":"matchRepoDigestOrExact"}`, "example.com/app", "example.com/app:latest", true},
		{`{"type":"matchRepoDigestOrExact"}`, "example.com/app@" + dig, "example.com/app:7", true},
		{`{"type":"matchRepoDigestOrExact"}`, "example.com/app@" + dig, "example.com/app@" + dig, true},
		{`{"type":"matchRepoDigestOrExact"}`, "example.com/app@" + dig, "example.com/app", false},
		{`{"type":"matchRepoDigestOrExact"}`, "example.com/app@" + dig, "example.com/other:7", false},
		{`{"type":"matchRepoDigestOrExact"}`, "example.com/app:1", "not a reference", false},
		// matchExact
		{`{"type":"matchExact"}`, "example.com/app:1", "example.com/app:1", true},
		{`{"type":"matchExact"}`, "example.com/app@" + dig, "example.com/app:1", false},
		{`{"type":"matchExact"}`, "example.com/app@" + dig, "example.com/app@" + dig, true},
		// matchRepository
		{`{"type":"matchRepository"}`, "example.com/app:1", "example.com/app", true},
		{`{"type":"matchRepository"}`, "example.com/app:1", "example.com/app:2", true},
		{`{"type":"matchRepository"}`, "example.com/app:1", "example.com/app2:1", false},
		// exactReference, exactRepository
		{`{"type":"exactReference","dockerReference":"vendor.example/app:1"}`, "mirror.example/app:1", "vendor.example/app:1", true},
		{`{"type":"exactReference","dockerReference":"vendor.example/app:1"}`, "mirror.example/app:1", "vendor.example/app:2", false},
		{`{"type":"exactReference","dockerReference":"vendor.example/app:1"}`, "mirror.example/app:1", "vendor.example/app", false},
		{`{"type":"exactRepository","dockerRepository":"vendor.example/app"}`, "mirror.example/app:1", "vendor.example/app:9", true},
		{`{"type":"exactRepository","dockerRepository":"vendor.example/app"}`, "mirror.example/app:1", "vendor.example/app", true},
		{`{"type":"exactRepository","dockerRepository":"vendor.example/app"}`, "mirror.example/app:1", "mirror.example/app:1", false},
		// remapIdentity
		{`{"type":"remapIdentity","prefix":"mirror.example/vendor","signedPrefix":"vendor.example"}`, "mirror.example/vendor/app:1", "vendor.example/app:1", true},
		{`{"type":"remapIdentity","prefix":"mirror.example/vendor","signedPrefix":"vendor.example"}`, "mirror.example/vendor/app:1", "mirror.example/vendor/app:1", false},
		{`{"type":"remapIdentity","prefix":"mirror.example/vendor","signedPrefix":"vendor.example"}`, "mirror.example/vendor/app@" + dig, "vendor.example/app:3", true},
		// Prefixes match whole path components only; no match leaves the identity as it is.
		{`{"type":"remapIdentity","prefix":"mirror.example/vendor","signedPrefix":"vendor.example"}`, "mirror.example/vendorx/app:1", "vendor.examplex/app:1", false},
		{`{"type":"remapIdentity","prefix":"mirror.example/vendor","signedPrefix":"vendor.example"}`, "mirror.example/vendorx/app:1", "mirror.example/vendorx/app:1", true},
		{`{"type":"remapIdentity","prefix":"mirror.example","signedPrefix":"docker.io"}`, "mirror.example/library/busybox:1", "busybox:1", true},
	}
	for _, tc := range cases {
		t.Run(tc.rule+" "+tc.image+" "+tc.signed, func(t *testing.T) {
			got, reason := rule(t, tc.rule).match(policyReference(mustNamed(t, tc.image)), tc.signed)
			if got != tc.want {
				t.Errorf("match = %v (%s), want %v", got, reason, tc.want)
			}
			if !got && reason == "" {
				t.Errorf("a mismatch without a reason")
			}
		})
	}
}

func TestParsePayload(t *testing.T) {
	const dig = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	good := `{"critical":{"identity":{"docker-reference":"example.com/app:1"},"image":{"docker-manifest-digest":"` + dig + `"},"type":"cosign container image signature"},"optional":null}`
	c, err := parsePayload([]byte(good))
	if err != nil || c.dockerReference != "example.com/app:1" || c.manifestDigest != dig {
		t.Fatalf("parsePayload(good) = %+v, %v", c, err)
	}
	for name, bad := range map[string]string{
		"no optional":         strings.Replace(good, `,"optional":null`, "", 1),
		"extra critical":      strings.Replace(good, `"type":`, `"extra":1,"type":`, 1),
		"extra top-level":     strings.Replace(good, `"optional":null`, `"optional":null,"more":1`, 1),
		"bad digest":          strings.Replace(good, dig, "sha256:xyz", 1),
		"optional not object": strings.Replace(good, `"optional":null`, `"optional":"x"`, 1),
		"duplicate identity":  strings.Replace(good, `"image":`, `"identity":{"docker-reference":"evil/app:1"},"image":`, 1),
		"trailing data":       good + "{}",
		"not JSON":            "critical",
	} {
		if _, err := parsePayload([]byte(bad)); err == nil {
			t.Errorf("parsePayload(%s) = nil error, want one", name)
		}
	}
}
