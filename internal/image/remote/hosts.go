package remote

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/crisp-runtime/crisp/internal/version"
)

// dockerHub is the canonical domain of Docker Hub in normalized references.
const dockerHub = "docker.io"

// canonicalHost lowercases a registry host and folds Docker Hub's several names into
// docker.io, so that configuration and credentials written with any of them match.
func canonicalHost(h string) string {
	h = strings.ToLower(h)
	switch h {
	case "index.docker.io", "registry-1.docker.io", "registry.hub.docker.com":
		return dockerHub
	}
	return h
}

// hostOf extracts host[:port] from what a person may write for a registry: a bare
// host, a host:port, or a URL such as "https://index.docker.io/v1/".
func hostOf(s string) string {
	host, _ := splitRegistryPath(s)
	return host
}

// splitRegistryPath splits what a person writes for a registry or a repository on
// one ("https://index.docker.io/v1/", "reg.example:5000/team/app") into its canonical
// host and the path after it, without a scheme or slashes at the ends.
func splitRegistryPath(s string) (host, path string) {
	s = strings.TrimSpace(s)
	if i := strings.Index(s, "://"); i >= 0 {
		s = s[i+3:]
	}
	host, path, _ = strings.Cut(s, "/")
	return canonicalHost(host), strings.Trim(path, "/")
}

// endpoint is one place a repository can be pulled from: a mirror or the registry.
type endpoint struct {
	host string // host[:port] to connect to
	// prefix is put before the repository path on a mirror: with the mirror
	// "https://m.example/hub", docker.io/library/busybox is m.example/hub/library/busybox.
	prefix    string
	plainHTTP bool   // the endpoint may be reached over plain HTTP
	mirror    bool   // a mirror, not the registry named in the reference
	display   string // how messages name the endpoint

	// What a hosts.toml may set; the zero values are the registry API's defaults.
	apiRoot   string                  // the API root replacing "/v2" in request paths ("/hub/v2", "/custom")
	header    http.Header             // sent with every request
	caps      docker.HostCapabilities // pull and resolve matter here
	transport *http.Transport         // the host's own TLS (CA, client certificates, skip_verify)
	fromDir   string                  // the host directory it came from
}

// allCaps is what an endpoint not restricted by a hosts.toml may do.
const allCaps = docker.HostCapabilityPull | docker.HostCapabilityResolve

// custom reports whether ep needs a transport of its own.
func (ep endpoint) custom() bool {
	return ep.fromDir != ""
}

// parseMirror parses a mirror endpoint: "http://127.0.0.1:5001", "https://m.example",
// "m.example/prefix" (no scheme means https).
func parseMirror(s string) (endpoint, error) {
	raw := s
	if !strings.Contains(s, "://") {
		s = "https://" + s
	}
	u, err := url.Parse(s)
	if err != nil {
		return endpoint{}, err
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return endpoint{}, fmt.Errorf("scheme %q is not http or https", u.Scheme)
	}
	if u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return endpoint{}, errors.New("want [http[s]://]host[:port][/path]")
	}
	return endpoint{
		host:      strings.ToLower(u.Host),
		prefix:    strings.Trim(u.Path, "/"),
		plainHTTP: u.Scheme == "http",
		mirror:    true,
		display:   raw,
		caps:      allCaps,
	}, nil
}

// hostPolicy decides, per host, whether plain HTTP and unverified TLS are allowed.
type hostPolicy struct {
	insecure map[string]bool // host or host:port from Config.Insecure
	nets     []*net.IPNet    // CIDRs from Config.Insecure, as docker accepts them
	// httpMirrors are hosts named by an http:// mirror URL: writing the scheme is
	// consent to plain HTTP for that host, as in containerd's hosts.toml.
	httpMirrors map[string]bool
}

func newHostPolicy(insecure []string, log *slog.Logger) *hostPolicy {
	p := &hostPolicy{insecure: map[string]bool{}, httpMirrors: map[string]bool{}}
	for _, s := range insecure {
		if _, n, err := net.ParseCIDR(strings.TrimSpace(s)); err == nil {
			p.nets = append(p.nets, n)
			continue
		}
		h := hostOf(s)
		if h == "" {
			log.Warn("ignoring empty insecure registry entry", "entry", s)
			continue
		}
		p.insecure[h] = true
	}
	return p
}

// isLoopback reports whether host (without port) is localhost or a loopback address.
func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") || strings.HasSuffix(strings.ToLower(host), ".localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// splitHost returns the host of host[:port] (brackets of IPv6 removed).
func splitHost(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	return strings.Trim(hostport, "[]")
}

// insecureHost reports whether hostport may use plain HTTP and unverified TLS:
// listed in Config.Insecure (with or without the port), inside a listed CIDR, or a
// loopback address, which docker and containerd always treat as insecure.
func (p *hostPolicy) insecureHost(hostport string) bool {
	return isLoopback(splitHost(hostport)) || p.listed(hostport)
}

// listed reports whether hostport is in Config.Insecure, by name or CIDR.
func (p *hostPolicy) listed(hostport string) bool {
	hostport = canonicalHost(hostport)
	host := splitHost(hostport)
	if p.insecure[hostport] || p.insecure[host] {
		return true
	}
	if ip := net.ParseIP(host); ip != nil {
		for _, n := range p.nets {
			if n.Contains(ip) {
				return true
			}
		}
	}
	return false
}

// plainHTTP reports whether plain HTTP to hostport is allowed.
func (p *hostPolicy) plainHTTP(hostport string) bool {
	return p.insecureHost(hostport) || p.httpMirrors[strings.ToLower(hostport)]
}

// policyTransport enforces hostPolicy on every request, whoever makes it: go-
// containerregistry itself falls back to plain HTTP for private addresses, and a
// token realm or a redirect may name any host.
type policyTransport struct {
	policy   *hostPolicy
	verified http.RoundTripper
	skipTLS  http.RoundTripper
}

func (t *policyTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	host := req.URL.Host
	if req.URL.Scheme == "http" && !t.policy.plainHTTP(host) {
		if req.Body != nil {
			_ = req.Body.Close()
		}
		return nil, fmt.Errorf("refusing plain HTTP to %s: it is not an insecure registry (add it to the insecure registries, or give its mirror URL as http://)", host)
	}
	if t.policy.insecureHost(host) {
		return t.skipTLS.RoundTrip(req)
	}
	return t.verified.RoundTrip(req)
}

// responseHeaderTimeout bounds the wait for a response's headers: a registry that
// accepts a request and never answers must not hang a pull even with the progress
// timeout off; a slow body is fine.
const responseHeaderTimeout = 2 * time.Minute

// endpointTransport carries the requests of one endpoint configured by a hosts.toml:
// to its host they go with its API root, headers and TLS, under its own consent to
// plain HTTP (its URL's scheme) and to unverified TLS (skip_verify) or crisp's
// insecure list; the loopback exemption does not apply, as in containerd, whose
// implicit localhost entry configures both itself. Requests to other hosts (token
// realms, blob redirects) take the shared policy.
type endpointTransport struct {
	ep     endpoint
	policy *policyTransport
}

func (t *endpointTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if len(t.ep.header) > 0 {
		req = req.Clone(req.Context())
		for k, vs := range t.ep.header {
			if req.Header.Get(k) == "" {
				req.Header[http.CanonicalHeaderKey(k)] = vs
			}
		}
	}
	if !strings.EqualFold(req.URL.Host, t.ep.host) {
		return t.policy.RoundTrip(req)
	}
	if t.ep.apiRoot != "" && (req.URL.Path == "/v2" || strings.HasPrefix(req.URL.Path, "/v2/")) {
		if len(t.ep.header) == 0 {
			req = req.Clone(req.Context())
		}
		req.URL.Path = t.ep.apiRoot + req.URL.Path[len("/v2"):]
		req.URL.RawPath = ""
	}
	listed := t.policy.policy.listed(req.URL.Host)
	if req.URL.Scheme == "http" && !t.ep.plainHTTP && !listed {
		if req.Body != nil {
			_ = req.Body.Close()
		}
		return nil, fmt.Errorf("refusing plain HTTP to %s: its hosts.toml (%s) names it with https (write http:// in the host's URL, or list it in registry.insecure)", req.URL.Host, t.ep.fromDir)
	}
	switch {
	case t.ep.transport != nil:
		return t.ep.transport.RoundTrip(req)
	case listed:
		return t.policy.skipTLS.RoundTrip(req)
	}
	return t.policy.verified.RoundTrip(req)
}

func newHTTPTransport(skipVerify bool) *http.Transport {
	return &http.Transport{
		Proxy: http.ProxyFromEnvironment,
		DialContext: (&net.Dialer{
			Timeout:   30 * time.Second,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          100,
		MaxIdleConnsPerHost:   16,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: responseHeaderTimeout,
		ExpectContinueTimeout: time.Second,
		TLSClientConfig: &tls.Config{
			MinVersion:         tls.VersionTLS12,
			InsecureSkipVerify: skipVerify, //nolint:gosec // G402: only for insecure hosts: listed by the operator, or loopback
		},
	}
}

// retryBackoff is shorter than go-containerregistry's default (1 s, 3 s): it waits
// without looking at the context, and a failing mirror should give way to the next
// endpoint quickly.
var retryBackoff = transport.Backoff{Duration: 100 * time.Millisecond, Factor: 3, Jitter: 0.1, Steps: 3}

// retryable says which round-trip failures are worth another try: network flakes and
// statuses a registry uses for transient trouble, never a cancelled context.
func retryable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var temp interface{ Temporary() bool }
	if errors.As(err, &temp) && temp.Temporary() {
		return true
	}
	return errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed)
}

// wrapTransport puts around inner what every registry request goes through: user
// agent, then retries, then the progress timeout (each attempt has its own), then
// inner.
func wrapTransport(inner http.RoundTripper, progress time.Duration) http.RoundTripper {
	if progress > 0 {
		inner = &progressTransport{next: inner, timeout: progress}
	}
	rt := transport.NewRetry(inner,
		transport.WithRetryBackoff(retryBackoff),
		transport.WithRetryPredicate(retryable),
		transport.WithRetryStatusCodes(http.StatusRequestTimeout, http.StatusTooManyRequests,
			http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout))
	return limitManifests(transport.NewUserAgent(rt, version.Name+"/"+version.Version))
}

// newPolicyTransport returns the shared transport of every endpoint not configured
// by a hosts.toml.
func newPolicyTransport(policy *hostPolicy) *policyTransport {
	return &policyTransport{policy: policy, verified: newHTTPTransport(false), skipTLS: newHTTPTransport(true)}
}
