package e2e

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	ggcrremote "github.com/google/go-containerregistry/pkg/v1/remote"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/image/imagetest"
)

// parityCase is one registry configuration both runtimes pull through.
type parityCase struct {
	name string
	// reg is the registry the case's image is pushed to (with push's options), refHost
	// the registry its reference names ("" is reg): another one when the hosts.toml
	// sends the pull elsewhere.
	reg, refHost string
	push         []ggcrremote.Option
	// alsoPush are more registries that get the image (a pull-only mirror).
	alsoPush []string
	// dirs are the host directories (name -> hosts.toml) written before both pulls and
	// removed after them.
	dirs map[string]string
	// ctrdOK and crispOK are the expected outcomes.
	ctrdOK, crispOK bool
	// errHas, for a failure, is what both errors must say.
	errHas string
	// deliberate says why crisp differs from containerd on purpose; empty: it must not.
	deliberate string
	// crispErrHas is what crisp's error must say when it fails on purpose.
	crispErrHas string
	// reset runs before each pull, check after it with the runtime's name.
	reset func()
	check func(t *testing.T, runtime string)
}

// parityResult is what one runtime did with a case.
type parityResult struct {
	err error
	id  string
}

// parityCauses pick the cause out of an error message for the table: the runtimes
// word the rest of their messages differently.
var parityCauses = regexp.MustCompile(`x509: certificate signed by unknown authority|tls: certificate required|` +
	`unable to read CA cert "[^"]*"|[^ /]*/hosts\.toml:\d+:\d+: toml: [^:]*|lookup [^ ]* on [^ ]*: no such host|` +
	`\b40[34] [A-Z][a-z]+( [A-Z][a-z]+)?|MANIFEST_UNKNOWN|NAME_UNKNOWN|not found`)

func (r parityResult) String() string {
	if r.err == nil {
		return "ok"
	}
	msg := status.Convert(r.err).Message()
	if m := parityCauses.FindString(msg); m != "" {
		msg = m
	} else if len(msg) > 110 {
		msg = "…" + msg[len(msg)-110:]
	}
	msg = strings.Join(strings.Fields(strings.ReplaceAll(msg, "|", `\|`)), " ")
	return fmt.Sprintf("fails (%s: %s)", status.Code(r.err), msg)
}

// TestE2ERegistryContainerdParity pulls the same references through containerd
// 2.4.2's CRI and criserver's, both reading registry host directories from one
// directory, case by case: the hosts.toml of each case is written once before both
// pulls. Each case has its own image (own blobs), so nothing cached makes a pull pass.
// It logs a table of the outcomes and fails when crisp differs from containerd other
// than on purpose (a hosts.toml crisp cannot decode is refused, not skipped; crisp's
// "*.domain" wildcard directories).
func TestE2ERegistryContainerdParity(t *testing.T) {
	shared, err := os.MkdirTemp("/tmp", "crisp-parity-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(shared) })
	hostsDir, pki := filepath.Join(shared, "certs.d"), filepath.Join(shared, "pki")
	for _, d := range []string{hostsDir, pki} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	c := newContainerd(t, func(c *ctrd, config *string) {
		own := fmt.Sprintf("config_path = %q", filepath.Join(c.dir, "certs.d"))
		if !strings.Contains(*config, own) {
			t.Fatalf("containerd's config has no %s", own)
		}
		*config = strings.Replace(*config, own, fmt.Sprintf("config_path = %q", hostsDir), 1)
	})
	e := newEnv(t)
	e.appendConfig(fmt.Sprintf("\n[registry]\nconfig_path = %q\n", hostsDir))
	e.start()
	ctx := ctxT(t)

	ca := imagetest.NewCA(t, "parity registry CA")
	otherCA := imagetest.NewCA(t, "parity other CA")
	clientCA := imagetest.NewCA(t, "parity client CA")
	caFile := imagetest.WriteFile(t, pki, "ca.pem", ca.CertPEM)
	otherFile := imagetest.WriteFile(t, pki, "other.pem", otherCA.CertPEM)
	cert, key := clientCA.Issue(t, "parity node")
	certFile := imagetest.WriteFile(t, pki, "client.cert", cert)
	keyFile := imagetest.WriteFile(t, pki, "client.key", key)

	tlsReg := imagetest.StartRegistry(t, imagetest.WithServerTLS(ca.ServerTLS(t, nil)))
	mtlsReg := imagetest.StartRegistry(t, imagetest.WithServerTLS(ca.ServerTLS(t, clientCA)))
	plain := imagetest.StartRegistry(t)
	var brokenLog imagetest.RequestLog
	broken := imagetest.StartRegistry(t, brokenLog.Option(), imagetest.WithErrorStatus(http.StatusServiceUnavailable, nil))
	// upstream resolves tags but its blob downloads fail: a pull-only mirror must
	// serve them; the mirror counts the tags it is asked to resolve.
	upstream := imagetest.StartRegistry(t, imagetest.WithErrorStatus(http.StatusServiceUnavailable, func(r *http.Request) bool {
		return r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/")
	}))
	var mirrorLog imagetest.RequestLog
	pullMirror := imagetest.StartRegistry(t, mirrorLog.Option())
	// Its API is below a path that does not end in /v2: only override_path reaches it.
	const prefix = "/api/images"
	prefixed := imagetest.StartRegistry(t, imagetest.WithPathPrefix(prefix))
	tenant := http.Header{"X-Tenant": {"blue"}}
	withHeader := imagetest.StartRegistry(t, imagetest.WithMiddleware(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("X-Tenant") != "blue" {
				http.Error(w, "no tenant", http.StatusForbidden)
				return
			}
			next.ServeHTTP(w, r)
		})
	}))
	pushTLS := []ggcrremote.Option{regPush{ca: ca}.option(t)}
	pushMTLS := []ggcrremote.Option{regPush{ca: ca, cert: cert, key: key}.option(t)}

	https := func(host, extra string) string {
		return fmt.Sprintf("server = %q\n%s\n", "https://"+host, extra)
	}
	mirror := func(url, extra string) string {
		return fmt.Sprintf("[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n%s\n", url, extra)
	}
	// hostPortDir is containerd's other name for host:port's directory.
	hostPortDir := func(hostport string) string {
		h, p, err := net.SplitHostPort(hostport)
		if err != nil {
			t.Fatal(err)
		}
		return h + "_" + p + "_"
	}
	// Hosts nobody listens on: references whose registry only a hosts.toml makes
	// reachable.
	var gone [8]string
	for i := range gone {
		gone[i] = imagetest.ClosedAddr(t)
	}
	const unknownCA = "certificate signed by unknown authority"

	cases := []parityCase{
		{name: "ca", reg: tlsReg, push: pushTLS, dirs: map[string]string{tlsReg: https(tlsReg, fmt.Sprintf("ca = %q", caFile))}, ctrdOK: true, crispOK: true},
		{name: "no ca (loopback host in hosts.toml)", reg: tlsReg, push: pushTLS, dirs: map[string]string{tlsReg: https(tlsReg, "")}, errHas: unknownCA},
		{name: "wrong ca", reg: tlsReg, push: pushTLS, dirs: map[string]string{tlsReg: https(tlsReg, fmt.Sprintf("ca = %q", otherFile))}, errHas: unknownCA},
		{name: "missing ca file", reg: tlsReg, push: pushTLS, dirs: map[string]string{tlsReg: https(tlsReg, `ca = "/nonexistent/ca.pem"`)}, errHas: "/nonexistent/ca.pem"},
		{name: "skip_verify = true", reg: tlsReg, push: pushTLS, dirs: map[string]string{tlsReg: https(tlsReg, "skip_verify = true")}, ctrdOK: true, crispOK: true},
		{name: "client cert pair", reg: mtlsReg, push: pushMTLS, dirs: map[string]string{mtlsReg: https(mtlsReg, fmt.Sprintf("ca = %q\nclient = [[%q, %q]]", caFile, certFile, keyFile))}, ctrdOK: true, crispOK: true},
		{name: "client cert missing", reg: mtlsReg, push: pushMTLS, dirs: map[string]string{mtlsReg: https(mtlsReg, fmt.Sprintf("ca = %q", caFile))}, errHas: "certificate required"},
		{
			name: "mirror order, first mirror 503, upstream down", reg: plain, refHost: gone[0],
			dirs:   map[string]string{gone[0]: https(gone[0], "") + mirror("http://"+broken, "") + mirror("http://"+plain, "")},
			ctrdOK: true, crispOK: true,
			reset: brokenLog.Reset,
			check: func(t *testing.T, runtime string) {
				if brokenLog.Count("/v2/") == 0 {
					t.Errorf("%s never asked the first mirror", runtime)
				}
			},
		},
		{
			name: "pull-only mirror, upstream resolves", reg: upstream, alsoPush: []string{pullMirror},
			dirs:   map[string]string{upstream: fmt.Sprintf("server = %q\n\n[host.%q]\n  capabilities = [\"pull\"]\n", "http://"+upstream, "http://"+pullMirror)},
			ctrdOK: true, crispOK: true,
			reset: mirrorLog.Reset,
			check: func(t *testing.T, runtime string) {
				if n := mirrorLog.Count("/manifests/v1"); n != 0 {
					t.Errorf("%s asked the pull-only mirror for the tag %d times", runtime, n)
				}
			},
		},
		{name: "_default directory", reg: plain, refHost: gone[1], dirs: map[string]string{"_default": mirror("http://"+plain, "")}, ctrdOK: true, crispOK: true},
		{name: "host:port directory", reg: plain, refHost: gone[2], dirs: map[string]string{gone[2]: mirror("http://"+plain, "")}, ctrdOK: true, crispOK: true},
		{name: "host_port_ directory before host:port", reg: plain, refHost: gone[3], dirs: map[string]string{
			hostPortDir(gone[3]): mirror("http://"+plain, ""),
			gone[3]:              mirror("http://"+broken, ""),
		}, ctrdOK: true, crispOK: true},
		{name: "override_path", reg: prefixed, push: []ggcrremote.Option{regPush{prefix: prefix}.option(t)}, refHost: gone[4],
			dirs: map[string]string{gone[4]: mirror("http://"+prefixed+prefix, "  override_path = true")}, ctrdOK: true, crispOK: true},
		{name: "path without override_path (/v2 appended)", reg: prefixed, push: []ggcrremote.Option{regPush{prefix: prefix}.option(t)}, refHost: gone[5],
			dirs: map[string]string{gone[5]: mirror("http://"+prefixed+prefix, "")}, errHas: "not found"},
		{name: "header the registry requires", reg: withHeader, push: []ggcrremote.Option{regPush{header: tenant}.option(t)}, refHost: gone[6],
			dirs: map[string]string{gone[6]: mirror("http://"+withHeader, "  [host.\"http://"+withHeader+"\".header]\n    X-Tenant = \"blue\"")}, ctrdOK: true, crispOK: true},
		{name: "header missing", reg: withHeader, push: []ggcrremote.Option{regPush{header: tenant}.option(t)}, refHost: gone[7],
			dirs: map[string]string{gone[7]: mirror("http://"+withHeader, "")}, errHas: "403 Forbidden"},
		{
			name: "hosts.toml syntax error", reg: plain,
			dirs:   map[string]string{plain: "server = \"http://" + plain + "\"\n[host.\"http://" + plain + "\"\n  capabilities = [\"pull\"]\n"},
			ctrdOK: true, crispOK: false,
			deliberate:  "containerd logs the error and pulls as if there were no hosts.toml; crisp refuses, naming the file",
			crispErrHas: filepath.Join(hostsDir, plain, "hosts.toml"),
		},
		{
			name: "*.domain wildcard directory", reg: plain, refHost: "wild.parity.example",
			dirs:   map[string]string{"*.parity.example": mirror("http://"+plain, "")},
			ctrdOK: false, crispOK: true,
			deliberate: "crisp's extension: containerd has no wildcard directories and goes to the unknown host itself",
		},
	}

	slug := regexp.MustCompile(`[^a-z0-9]+`)
	var table strings.Builder
	table.WriteString("\n| case | containerd " + containerdVersion + " | crisp | same? |\n|---|---|---|---|\n")
	differ := 0
	for _, tc := range cases {
		repo := "parity/" + strings.Trim(slug.ReplaceAllString(strings.ToLower(tc.name), "-"), "-")
		img := regImage(t, tc.name)
		want := imagetest.ConfigDigest(t, img).String()
		imagetest.Push(t, tc.reg, repo+":v1", img, tc.push...)
		for _, r := range tc.alsoPush {
			imagetest.Push(t, r, repo+":v1", img)
		}
		host := tc.refHost
		if host == "" {
			host = tc.reg
		}
		ref := host + "/" + repo + ":v1"
		for dir, body := range tc.dirs {
			imagetest.WriteHosts(t, hostsDir, dir, body)
		}
		var res [2]parityResult
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			for i, rt := range []struct {
				name   string
				img    cri.ImageServiceClient
				wantOK bool
			}{{"containerd", c.img, tc.ctrdOK}, {"crisp", e.img, tc.crispOK}} {
				if tc.reset != nil {
					tc.reset()
				}
				pctx, cancel := regPullCtx(ctx)
				start := time.Now()
				resp, err := rt.img.PullImage(pctx, &cri.PullImageRequest{Image: &cri.ImageSpec{Image: ref}})
				cancel()
				res[i] = parityResult{err: err, id: resp.GetImageRef()}
				t.Logf("%s: %s after %v: %v", rt.name, ref, time.Since(start).Round(time.Millisecond), res[i])
				switch {
				case rt.wantOK && err != nil:
					t.Errorf("%s: pull %s: %v, want it to succeed", rt.name, ref, err)
				case !rt.wantOK && err == nil:
					t.Errorf("%s: pull %s succeeded, want it to fail", rt.name, ref)
				case err == nil && res[i].id != want:
					// Both answer with the image id: the config's digest.
					t.Errorf("%s: pulled %s, want %s", rt.name, res[i].id, want)
				case err != nil && tc.deliberate == "" && tc.errHas != "" && !strings.Contains(err.Error(), tc.errHas):
					t.Errorf("%s: %v, want an error saying %q", rt.name, err, tc.errHas)
				case err != nil && rt.name == "crisp" && tc.crispErrHas != "" &&
					(!strings.Contains(err.Error(), tc.crispErrHas) || status.Code(err) != codes.FailedPrecondition):
					t.Errorf("crisp: %v, want FailedPrecondition naming %s", err, tc.crispErrHas)
				}
				if tc.check != nil {
					tc.check(t, rt.name)
				}
			}
		})
		for dir := range tc.dirs {
			if err := os.RemoveAll(filepath.Join(hostsDir, dir)); err != nil {
				t.Fatal(err)
			}
		}
		same := (res[0].err == nil) == (res[1].err == nil)
		verdict := "yes"
		switch {
		case !same && tc.deliberate != "":
			verdict = "no (deliberate: " + tc.deliberate + ")"
		case !same:
			verdict = "**NO**"
			differ++
		case tc.deliberate != "":
			verdict = "yes (a deliberate difference did not show)"
		}
		fmt.Fprintf(&table, "| %s | %s | %s | %s |\n", tc.name, res[0], res[1], verdict)
	}
	t.Log(table.String())
	if differ > 0 {
		t.Errorf("crisp and containerd differ in %d case(s) where they should not (see the table)", differ)
	}
}
