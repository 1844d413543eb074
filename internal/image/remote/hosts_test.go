package remote

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

func TestHostPolicy(t *testing.T) {
	p := newHostPolicy([]string{"myreg:5000", "plain.example", "https://other.example/v2/", "10.1.0.0/16"}, slog.Default())
	ep, err := parseMirror("http://mirror.example:8080/prefix")
	if err != nil {
		t.Fatal(err)
	}
	p.httpMirrors[ep.host] = true
	for _, tc := range []struct {
		host              string
		insecure, plainOK bool
	}{
		{"127.0.0.1:5000", true, true},
		{"127.8.9.10", true, true},
		{"localhost:5000", true, true},
		{"[::1]:5000", true, true},
		{"myreg:5000", true, true},
		{"myreg:5001", false, false}, // the port is part of the entry
		{"plain.example:443", true, true},
		{"other.example", true, true},
		{"10.1.2.3:5000", true, true},
		{"10.2.0.1:5000", false, false},
		{"mirror.example:8080", false, true}, // an http:// mirror: plain HTTP, but TLS still verified
		{"registry.k8s.io", false, false},
		{"index.docker.io", false, false},
	} {
		if got := p.insecureHost(tc.host); got != tc.insecure {
			t.Errorf("insecureHost(%s) = %v, want %v", tc.host, got, tc.insecure)
		}
		if got := p.plainHTTP(tc.host); got != tc.plainOK {
			t.Errorf("plainHTTP(%s) = %v, want %v", tc.host, got, tc.plainOK)
		}
	}
}

// TestPolicyRefusesPlainHTTP checks the refusal happens before anything is sent:
// go-containerregistry falls back to plain HTTP for private addresses on its own.
func TestPolicyRefusesPlainHTTP(t *testing.T) {
	var sent atomic.Int32
	rt := &policyTransport{
		policy:   newHostPolicy(nil, slog.Default()),
		verified: roundTripFunc(func(*http.Request) (*http.Response, error) { sent.Add(1); return nil, errors.New("sent") }),
		skipTLS:  roundTripFunc(func(*http.Request) (*http.Response, error) { sent.Add(1); return nil, errors.New("sent") }),
	}
	for _, u := range []string{"http://10.0.0.1:5000/v2/", "http://registry.example/v2/"} {
		req, _ := http.NewRequest(http.MethodGet, u, nil)
		_, err := rt.RoundTrip(req)
		if err == nil || !strings.Contains(err.Error(), "refusing plain HTTP") {
			t.Errorf("GET %s: %v, want a refusal", u, err)
		}
	}
	if sent.Load() != 0 {
		t.Fatal("a refused request was sent")
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestParseMirror(t *testing.T) {
	for _, tc := range []struct {
		in                  string
		host, prefix        string
		plainHTTP, wantFail bool
	}{
		{in: "http://127.0.0.1:5001", host: "127.0.0.1:5001", plainHTTP: true},
		{in: "https://Mirror.Example", host: "mirror.example"},
		{in: "mirror.example/hub/", host: "mirror.example", prefix: "hub"},
		{in: "https://m.example/a/b", host: "m.example", prefix: "a/b"},
		{in: "ftp://m.example", wantFail: true},
		{in: "https://user:pw@m.example", wantFail: true},
		{in: "http://", wantFail: true},
	} {
		ep, err := parseMirror(tc.in)
		if tc.wantFail {
			if err == nil {
				t.Errorf("parseMirror(%q) accepted", tc.in)
			}
			continue
		}
		if err != nil || ep.host != tc.host || ep.prefix != tc.prefix || ep.plainHTTP != tc.plainHTTP || !ep.mirror {
			t.Errorf("parseMirror(%q) = %+v, %v", tc.in, ep, err)
		}
	}
}

func TestCredentialsScope(t *testing.T) {
	a := &Auth{Username: "u", Password: "p"}
	for _, tc := range []struct {
		auth           *Auth
		host, registry string
		want           bool
	}{
		{a, "docker.io", "docker.io", true},
		{a, "mirror.example", "docker.io", false},
		{&Auth{Username: "u", Password: "p", ServerAddress: "https://index.docker.io/v1/"}, "docker.io", "docker.io", true},
		{&Auth{Username: "u", Password: "p", ServerAddress: "mirror.example"}, "mirror.example", "docker.io", true},
		{&Auth{Username: "u", Password: "p", ServerAddress: "mirror.example"}, "docker.io", "docker.io", false},
		{&Auth{Username: "u", Password: "p", ServerAddress: "myreg:5000"}, "myreg:5000", "myreg:5000", true},
		{&Auth{ServerAddress: "myreg:5000"}, "myreg:5000", "myreg:5000", false}, // no secret at all
		{nil, "docker.io", "docker.io", false},
	} {
		authr, sent, err := tc.auth.credentials(tc.host, tc.registry)
		if err != nil || sent != tc.want || (sent == (authr == authn.Anonymous)) {
			t.Errorf("%+v towards %s for %s: sent=%v err=%v, want sent=%v", tc.auth, tc.host, tc.registry, sent, err, tc.want)
		}
	}
	authr, _, err := (&Auth{Auth: "dTpwOng="}).credentials("r", "r") // "u:p:x": the password may hold colons
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ := authr.Authorization()
	if cfg.Username != "u" || cfg.Password != "p:x" {
		t.Errorf("auth field decoded to %q / %q", cfg.Username, cfg.Password)
	}
	for _, bad := range []string{"!!!", "bm9jb2xvbg=="} { // not base64; "nocolon"
		if _, _, err := (&Auth{Auth: bad}).credentials("r", "r"); err == nil {
			t.Errorf("auth field %q accepted", bad)
		}
	}
}

func TestSelectManifest(t *testing.T) {
	desc := func(os, arch, variant string) ocispec.Descriptor {
		return ocispec.Descriptor{
			Digest:   digest.FromString(os + arch + variant),
			Platform: &ocispec.Platform{OS: os, Architecture: arch, Variant: variant},
		}
	}
	idx := &ocispec.Index{Manifests: []ocispec.Descriptor{
		desc("unknown", "unknown", ""),
		desc("linux", "arm", "v6"),
		desc("linux", "arm", "v7"),
		desc("linux", "arm64", "v8"),
		desc("linux", "amd64", ""),
		desc("windows", "amd64", ""),
	}}
	for _, tc := range []struct{ want, platform string }{
		{"linuxamd64", "linux/amd64"},
		{"linuxamd64", "linux/x86_64"},
		{"linuxarm64v8", "linux/arm64"},
		{"linuxarm64v8", "linux/aarch64"},
		{"linuxarmv7", "linux/arm"},
		{"linuxarmv6", "linux/arm/v6"},
		{"windowsamd64", "windows/amd64"},
	} {
		p, err := parsePlatform(tc.platform)
		if err != nil {
			t.Fatal(err)
		}
		d, err := selectManifest(idx, p)
		if err != nil || d.Digest != digest.FromString(tc.want) {
			t.Errorf("platform %s: got %s, %v; want the %s entry", tc.platform, d.Digest, err, tc.want)
		}
	}
	p, _ := parsePlatform("linux/riscv64")
	if _, err := selectManifest(idx, p); err == nil || !strings.Contains(err.Error(), "linux/arm/v7") {
		t.Errorf("missing platform: %v", err)
	}
	for _, bad := range []string{"linux", "linux/", "/amd64", "a/b/c/d"} {
		if _, err := parsePlatform(bad); err == nil {
			t.Errorf("parsePlatform(%q) accepted", bad)
		}
	}
}

func TestManifestMediaType(t *testing.T) {
	for _, tc := range []struct{ ct, body, want string }{
		{ocispec.MediaTypeImageManifest, `{}`, ocispec.MediaTypeImageManifest},
		{mediaTypeDockerManifestList + "; charset=utf-8", `{}`, mediaTypeDockerManifestList},
		{"application/json", `{"mediaType":"` + mediaTypeDockerManifest + `"}`, mediaTypeDockerManifest},
		{"", `{"schemaVersion":2,"manifests":[]}`, ocispec.MediaTypeImageIndex},
		{"text/plain", `{"schemaVersion":2,"config":{},"layers":[]}`, ocispec.MediaTypeImageManifest},
		{"", `{"schemaVersion":1,"fsLayers":[]}`, mediaTypeDockerSchema1},
	} {
		if got := manifestMediaType(tc.ct, []byte(tc.body)); got != tc.want {
			t.Errorf("manifestMediaType(%q, %s) = %q, want %q", tc.ct, tc.body, got, tc.want)
		}
	}
}

func TestFlightGroup(t *testing.T) {
	var g flightGroup
	key := digest.FromString("k")
	var runs atomic.Int32
	release := make(chan struct{})
	var wg sync.WaitGroup
	shared := atomic.Int32{}
	for range 5 {
		wg.Go(func() {
			s, err := g.do(context.Background(), key, func(ctx context.Context) error {
				runs.Add(1)
				<-release
				return nil
			})
			if err != nil {
				t.Error(err)
			}
			if s {
				shared.Add(1)
			}
		})
	}
	time.Sleep(50 * time.Millisecond)
	close(release)
	wg.Wait()
	if runs.Load() != 1 || shared.Load() != 4 {
		t.Errorf("%d runs, %d shared results; want 1 and 4", runs.Load(), shared.Load())
	}

	// The run is cancelled only when its last waiter leaves, and do waits for it.
	ctx1, cancel1 := context.WithCancel(context.Background())
	ctx2, cancel2 := context.WithCancel(context.Background())
	started, finished := make(chan struct{}), make(chan struct{})
	var runErr error
	// The first caller's own result is the cancellation; what the test checks is that
	// the run outlives it while another caller waits.
	go func() {
		_, _ = g.do(ctx1, key, func(ctx context.Context) error {
			close(started)
			<-ctx.Done()
			runErr = ctx.Err()
			time.Sleep(20 * time.Millisecond) // cleanup takes a moment
			close(finished)
			return runErr
		})
	}()
	<-started
	done2 := make(chan error)
	go func() { _, err := g.do(ctx2, key, nil); done2 <- err }()
	time.Sleep(20 * time.Millisecond)
	cancel1()
	select {
	case <-finished:
		t.Fatal("run cancelled while a waiter remained")
	case <-time.After(50 * time.Millisecond):
	}
	cancel2()
	if err := <-done2; !errors.Is(err, context.Canceled) {
		t.Fatalf("last waiter got %v", err)
	}
	select {
	case <-finished:
	default:
		t.Fatal("do returned before the cancelled run finished")
	}
}
