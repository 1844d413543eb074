package remote

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/errdefs"
	"github.com/distribution/reference"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/errgroup"

	"github.com/crisp-runtime/crisp/internal/image/content"
	"github.com/crisp-runtime/crisp/internal/image/diskspace"
	"github.com/crisp-runtime/crisp/internal/image/sigpolicy"
	"github.com/crisp-runtime/crisp/internal/tracing"
)

// Limits on what is read into memory. Real manifests and configs are a few KiB; the
// OCI distribution spec asks registries to accept manifests of at least 4 MiB.
const (
	maxManifestSize = 4 << 20
	maxConfigSize   = 8 << 20
	// maxIndexDepth bounds indexes nested in indexes.
	maxIndexDepth = 4
)

// Media types crisp pulls. Docker's zstd layer type is containerd's name for it.
const (
	mediaTypeDockerManifest     = "application/vnd.docker.distribution.manifest.v2+json"
	mediaTypeDockerManifestList = "application/vnd.docker.distribution.manifest.list.v2+json"
	mediaTypeDockerConfig       = "application/vnd.docker.container.image.v1+json"
	mediaTypeDockerSchema1      = "application/vnd.docker.distribution.manifest.v1+json"
	mediaTypeDockerSchema1JWS   = "application/vnd.docker.distribution.manifest.v1+prettyjws"
)

// layerMediaTypes are the layer media types crisp can unpack. Nondistributable and
// foreign layers are fetched from the registry like any other; their URLs are not used.
var layerMediaTypes = map[string]bool{
	ocispec.MediaTypeImageLayer:     true, // tar
	ocispec.MediaTypeImageLayerGzip: true,
	ocispec.MediaTypeImageLayerZstd: true,
	// Deprecated by OCI but still found in the wild (Windows bases pushed as such).
	"application/vnd.oci.image.layer.nondistributable.v1.tar":      true,
	"application/vnd.oci.image.layer.nondistributable.v1.tar+gzip": true,
	"application/vnd.oci.image.layer.nondistributable.v1.tar+zstd": true,
	"application/vnd.docker.image.rootfs.diff.tar":                 true,
	"application/vnd.docker.image.rootfs.diff.tar.gzip":            true,
	"application/vnd.docker.image.rootfs.diff.tar.zstd":            true,
	"application/vnd.docker.image.rootfs.foreign.diff.tar.gzip":    true,
}

// Config configures a Puller.
type Config struct {
	// Mirrors maps a registry host ("docker.io", "registry.k8s.io", "myreg:5000") to mirror
	// endpoints ("http://127.0.0.1:5001", "https://mirror.example"); tried in order, then the registry itself.
	// A path on a mirror URL is a repository prefix: with "https://m.example/hub",
	// docker.io/library/busybox is pulled as m.example/hub/library/busybox.
	Mirrors map[string][]string
	// Insecure lists hosts (host or host:port) allowed over plain HTTP or with unverified TLS.
	// localhost, 127.0.0.0/8 and ::1 are always allowed over plain HTTP, as docker does.
	// CIDRs ("10.0.0.0/8") are accepted too, as docker's insecure-registries are.
	Insecure []string
	// MaxConcurrentDownloads bounds the blobs one pull downloads at once (default 3).
	MaxConcurrentDownloads int
	// Platform is the "os/arch[/variant]" picked from an index (default "linux/"+runtime.GOARCH).
	Platform string
	// DeferSync stores blobs without fsyncs (content.Store.WriteUnsynced): the caller
	// flushes the store before it records anything that references them, and frees
	// unreferenced blobs at its start.
	DeferSync bool
	// Reserve is the free space downloads must leave on the content store's
	// filesystem; checked against the layers' sizes before they are downloaded and
	// while they are written.
	Reserve diskspace.Reserve
	// HostsDir is a directory of containerd hosts.toml host directories, read on every
	// pull; a registry with a directory there (its own, a wildcard or _default) is
	// reached as it says, and Mirrors are not used for it. Empty: none.
	HostsDir string
	// AuthFile is a Docker config.json with credentials for pulls that carry none.
	AuthFile string
	// ProgressTimeout cancels a request (and so the pull) when no byte of it arrives
	// for this long; 0 disables it.
	ProgressTimeout time.Duration
	// Policy decides from its signatures whether an image may be pulled, before
	// anything of it is stored; nil admits every image.
	Policy *sigpolicy.Policy
}

// Layer is one layer blob of a pulled image.
type Layer struct {
	Digest    digest.Digest // of the blob as stored (compressed)
	Size      int64
	MediaType string        // tells the unpacker the compression: tar, tar+gzip or tar+zstd; or a wasm module
	DiffID    digest.Digest // of the uncompressed tar, from the config's rootfs.diff_ids
	// Path is the file a wasm artifact's module layer (MediaTypeWasmLayer) becomes at
	// the root of the image's filesystem; its DiffID is then crisp's own (see
	// wasmLayers). Empty for a tar layer.
	Path string `json:",omitempty"`
}

// Image is what a pull fetched into the content store.
type Image struct {
	Name           string        // normalized reference that was pulled
	ManifestDigest digest.Digest // digest of the platform manifest (not the index)
	IndexDigest    digest.Digest // digest of the index if the ref pointed at one (else empty)
	// RepoDigest is "repository@digest" of what the reference resolved to: the index
	// digest if there is one, as containerd and kubelet report it.
	RepoDigest   string
	ConfigDigest digest.Digest // = the image ID
	// ConfigMediaType is the manifest's config media type: an image config, or
	// MediaTypeWasmConfig for a wasm artifact, whose layers are modules.
	ConfigMediaType string
	Layers          []Layer // bottom first; DiffIDs from the config's rootfs.diff_ids
	// Downloaded is what this pull transferred from the registry: blobs already in the
	// store, or shared with a concurrent pull that fetched them, are not counted.
	Downloaded int64
}

// Puller pulls images from registries into a content store. It is safe for
// concurrent use; concurrent pulls share the download of a blob they both need.
type Puller struct {
	cs           *content.Store
	log          *slog.Logger
	rt           http.RoundTripper // p.base with what every request goes through
	base         *policyTransport
	policy       *hostPolicy
	hostsDir     string
	authFile     string
	progress     time.Duration
	sigPolicy    *sigpolicy.Policy
	mirrors      map[string][]endpoint
	platform     ocispec.Platform
	maxDownloads int
	reserve      diskspace.Reserve
	deferSync    bool
	flights      flightGroup
}

// New returns a Puller storing into cs. Invalid mirrors or platform in cfg are logged
// and ignored (the platform falls back to the default) so that one bad setting does
// not stop the node from pulling at all.
func New(cfg Config, cs *content.Store, log *slog.Logger) *Puller {
	if log == nil {
		log = slog.Default()
	}
	policy := newHostPolicy(cfg.Insecure, log)
	p := &Puller{
		cs:           cs,
		log:          log,
		mirrors:      map[string][]endpoint{},
		maxDownloads: cfg.MaxConcurrentDownloads,
		reserve:      cfg.Reserve,
		deferSync:    cfg.DeferSync,
		hostsDir:     cfg.HostsDir,
		authFile:     cfg.AuthFile,
		progress:     cfg.ProgressTimeout,
		sigPolicy:    cfg.Policy,
	}
	if p.maxDownloads <= 0 {
		p.maxDownloads = 3
	}
	p.platform = ocispec.Platform{OS: "linux", Architecture: runtime.GOARCH}
	if cfg.Platform != "" {
		pl, err := parsePlatform(cfg.Platform)
		if err != nil {
			log.Error("ignoring invalid pull platform", "err", err, "using", platformString(p.platform))
		} else {
			p.platform = pl
		}
	}
	p.platform = normalizePlatform(p.platform)
	for reg, urls := range cfg.Mirrors {
		key := hostOf(reg)
		for _, u := range urls {
			ep, err := parseMirror(u)
			if err != nil {
				log.Error("ignoring invalid registry mirror", "registry", reg, "mirror", u, "err", err)
				continue
			}
			if ep.plainHTTP {
				policy.httpMirrors[ep.host] = true
			}
			p.mirrors[key] = append(p.mirrors[key], ep)
		}
	}
	p.base = newPolicyTransport(policy)
	p.rt = wrapTransport(p.base, p.progress)
	p.policy = policy
	return p
}

// endpoints returns where to pull a repository of registry domain from: what its
// host directory under HostsDir says if it has one, else its mirrors in order, then
// the registry itself.
func (p *Puller) endpoints(ctx context.Context, domain string) ([]endpoint, error) {
	eps, found, err := p.hostsEndpoints(ctx, domain)
	if found || err != nil {
		return eps, err
	}
	eps = append([]endpoint(nil), p.mirrors[canonicalHost(domain)]...)
	return append(eps, endpoint{
		host:      domain,
		plainHTTP: p.policy.plainHTTP(domain),
		display:   domain,
		caps:      allCaps,
	}), nil
}

// transportFor returns the transport of requests to ep.
func (p *Puller) transportFor(ep endpoint) http.RoundTripper {
	if !ep.custom() {
		return p.rt
	}
	return wrapTransport(&endpointTransport{ep: ep, policy: p.base}, p.progress)
}

// credsFunc returns the authenticator for a repository path on an endpoint, and
// whether it carries credentials.
type credsFunc func(ep endpoint, path string) (authn.Authenticator, bool, error)

// credentials returns how a pull from registry domain authenticates to each endpoint:
// with the request's credentials where they are meant to go, else with the node's
// auth file's entry for the endpoint's host and repository, else anonymously. The
// file is read once per pull, when first needed, so that edits apply to the next
// pull.
func (p *Puller) credentials(auth *Auth, domain string) credsFunc {
	var (
		af     *authFile
		afErr  error
		afRead bool
	)
	return func(ep endpoint, path string) (authn.Authenticator, bool, error) {
		a, withCreds, err := auth.credentials(ep.host, domain)
		if err != nil || withCreds || p.authFile == "" {
			return a, withCreds, err
		}
		if !afRead {
			af, afErr = readAuthFile(p.authFile)
			if errors.Is(afErr, os.ErrNotExist) {
				// Node tooling may write it later: until then it holds nothing.
				af, afErr = &authFile{}, nil
			}
			afRead = true
		}
		if afErr != nil {
			return nil, false, fmt.Errorf("%w: %w", afErr, errdefs.ErrFailedPrecondition)
		}
		fa, ok := af.lookup(ep.host, path)
		if !ok {
			return authn.Anonymous, false, nil
		}
		return fa.credentials(ep.host, ep.host)
	}
}

// Pull resolves ref (an index to the manifest for the configured platform; Docker
// schema 2 and OCI media types), stores the manifest(s), the config and every layer
// blob in the content store (each verified by it), downloading at most
// MaxConcurrentDownloads blobs at once and skipping blobs already present, and returns
// what it fetched. auth is used only for the registry whose host matches its
// ServerAddress (or the reference's registry when ServerAddress is empty). Mirrors are
// tried first; any failure on one moves on to the next endpoint.
func (p *Puller) Pull(ctx context.Context, ref string, auth *Auth) (*Image, error) {
	return p.PullLayers(ctx, ref, auth, nil)
}

// Unpacker is given the layers of a pull (bottom first) once its config is checked,
// and returns the function the pull runs for each of them. It is called once for each
// endpoint the pull tries, so that per-pull state starts afresh on a mirror's failure.
type Unpacker func(layers []Layer) LayerFunc

// LayerFunc handles layer i of a pull. The pull calls it for every layer at
// once, each in its own goroutine, after the manifest and config are stored; fetch gets
// the layer's blob into the content store, at most MaxConcurrentDownloads at a time
// for the pull. The pull fails with the first error a LayerFunc returns, and the
// context of the others is then cancelled.
type LayerFunc func(ctx context.Context, i int, l Layer, fetch FetchFunc) error

// FetchFunc makes sure a layer blob is in the content store. When it downloads the blob
// and consume is not nil, consume gets the bytes as they arrive, in the same read of
// the connection that stores them, and streamed is true: consume's reader ends with
// io.EOF only once the whole blob is stored and verified against its digest, and with
// the download's error otherwise, so a consumer that reads to the end has a verified
// blob. consume's error fails the fetch; a consumer that stops reading early does not
// stop the download (another pull may wait for the blob). When the blob is stored
// already, or another pull downloads it, consume is not called: read the blob from the
// content store.
type FetchFunc func(ctx context.Context, consume func(io.Reader) error) (streamed bool, err error)

// PullLayers is Pull with each layer handed to the LayerFunc of unpacker instead of
// just stored (nil: just stored), so that a caller can unpack layers while they
// download.
func (p *Puller) PullLayers(ctx context.Context, ref string, auth *Auth, unpacker Unpacker) (*Image, error) {
	start := time.Now()
	named, err := Normalize(ref)
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", ref, err)
	}
	name := named.String()
	// Check the credentials once, before any request, so a malformed one is reported
	// as such and not as a failure of every endpoint.
	if _, _, err := auth.credentials(reference.Domain(named), reference.Domain(named)); err != nil {
		return nil, fmt.Errorf("pull %s: %w", name, err)
	}
	domain := reference.Domain(named)
	eps, err := p.endpoints(ctx, domain)
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", name, err)
	}
	defer closeIdle(eps)
	creds := p.credentials(auth, domain)
	target := named
	if _, byDigest := named.(reference.Digested); !byDigest && !allResolve(eps) {
		d, err := p.resolve(ctx, named, eps, creds)
		if err != nil {
			return nil, fmt.Errorf("pull %s: %w", name, err)
		}
		if target, err = reference.WithDigest(reference.TrimNamed(named), d); err != nil {
			return nil, fmt.Errorf("pull %s: %w", name, err)
		}
	}
	var mirrorErrs []string
	for i, ep := range eps {
		var stats pullStats
		img, err := p.pullFrom(ctx, named, target, ep, creds, &stats, unpacker)
		if err == nil {
			img.Name = name
			img.Downloaded = stats.bytes.Load()
			img.RepoDigest = reference.TrimNamed(named).String() + "@" + img.ManifestDigest.String()
			if img.IndexDigest != "" {
				img.RepoDigest = reference.TrimNamed(named).String() + "@" + img.IndexDigest.String()
			}
			p.log.Debug("fetched image", "ref", name, "from", ep.display, "id", img.ConfigDigest,
				"blobs_downloaded", stats.blobs.Load(), "bytes_downloaded", stats.bytes.Load(), "duration", time.Since(start))
			return img, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("pull %s: %w", name, err)
		}
		if i < len(eps)-1 {
			p.log.Warn("pull from mirror failed, trying the next endpoint", "ref", name, "mirror", ep.display, "err", err)
			if span := trace.SpanFromContext(ctx); span.IsRecording() {
				span.AddEvent("endpoint failed, trying the next", trace.WithAttributes(attrServerAddress.String(ep.host), attrError.String(err.Error())))
			}
			mirrorErrs = append(mirrorErrs, fmt.Sprintf("mirror %s: %v", ep.display, err))
			continue
		}
		if len(mirrorErrs) > 0 {
			return nil, fmt.Errorf("pull %s: %w (mirrors failed first: %s)", name, err, strings.Join(mirrorErrs, "; "))
		}
		return nil, fmt.Errorf("pull %s: %w", name, err)
	}
	panic("unreachable: endpoints always ends with the registry")
}

// checkPolicy asks the signature policy whether the image asked, which resolved to
// top (an index or a manifest: what signatures sign) on src, may be pulled. It runs
// before anything of the image is stored, so a refused image leaves nothing behind.
//
// The check is span image.verify; a refusal is its error.
func (p *Puller) checkPolicy(ctx context.Context, asked reference.Named, top digest.Digest, src *source) error {
	if p.sigPolicy == nil {
		return nil
	}
	ctx, span := tracing.Start(ctx, spanVerify)
	start := time.Now()
	err := p.sigPolicy.Verify(ctx, sigpolicy.Image{Named: asked, Digest: top, Repository: src.repo, Transport: src.tr})
	if span.IsRecording() {
		span.SetAttributes(attrRef.String(asked.String()), attrDigest.String(top.String()),
			attrRequirement.String(p.sigPolicy.Describe(asked)), attrAdmitted.Bool(err == nil))
	}
	tracing.End(span, err)
	p.log.Debug("signature policy checked", "ref", asked.String(), "digest", top, "from", src.ep.display,
		"requirement", p.sigPolicy.Describe(asked), "admitted", err == nil, "duration", time.Since(start))
	return err
}

// allResolve reports whether every endpoint may resolve tags: then each is asked
// for the tag itself, else the tag is resolved once by those that may.
func allResolve(eps []endpoint) bool {
	for _, ep := range eps {
		if !ep.caps.Has(docker.HostCapabilityResolve) {
			return false
		}
	}
	return true
}

// resolve returns the digest tag ref names, asked of the endpoints with the resolve
// capability in order, as containerd asks hosts with both pull and resolve.
//
// It is span image.resolve.tag.
func (p *Puller) resolve(ctx context.Context, named reference.Named, eps []endpoint, creds credsFunc) (d digest.Digest, err error) {
	ctx, span := tracing.Start(ctx, spanResolveTag)
	defer tracing.Finish(span, &err)
	if span.IsRecording() {
		span.SetAttributes(attrRef.String(named.String()))
	}
	var errs []string
	for _, ep := range eps {
		if !ep.caps.Has(docker.HostCapabilityResolve) {
			continue
		}
		src, err := p.open(ctx, named, ep, creds)
		if err == nil {
			var desc *v1.Descriptor
			ref := src.repo.Tag(named.(reference.Tagged).Tag())
			desc, err = remote.Head(ref, remote.WithContext(ctx), remote.WithTransport(src.tr))
			if err == nil {
				if span.IsRecording() {
					setEndpoint(span, ep)
					span.SetAttributes(attrDigest.String(desc.Digest.String()))
				}
				return digest.Digest(desc.Digest.String()), nil
			}
			err = classify(err, ep, "tag "+named.String(), src.withCreds)
		}
		if ctx.Err() != nil {
			return "", err
		}
		errs = append(errs, err.Error())
	}
	if len(errs) == 0 {
		return "", fmt.Errorf("no host in %s has the resolve capability to resolve tag %s: pull it by digest or give a host \"resolve\": %w", eps[0].fromDir, named, errdefs.ErrFailedPrecondition)
	}
	return "", fmt.Errorf("resolve tag: %s", strings.Join(errs, "; "))
}

// closeIdle closes the idle connections of the endpoints' own transports: they are
// made for one pull.
func closeIdle(eps []endpoint) {
	for _, ep := range eps {
		if ep.transport != nil {
			ep.transport.CloseIdleConnections()
		}
	}
}

// pullStats counts what one pull downloaded, for the log.
type pullStats struct {
	blobs atomic.Int64
	bytes atomic.Int64
}

// source is one repository on one endpoint with its authenticated transport.
type source struct {
	ep        endpoint
	repo      name.Repository
	tr        http.RoundTripper
	client    *http.Client
	withCreds bool
}

// open starts talking to named's repository on ep: the ping and token handshake.
func (p *Puller) open(ctx context.Context, named reference.Named, ep endpoint, creds credsFunc) (*source, error) {
	path := reference.Path(named)
	if ep.prefix != "" {
		path = ep.prefix + "/" + path
	}
	var nopts []name.Option
	if ep.plainHTTP {
		nopts = append(nopts, name.Insecure)
	}
	repo, err := name.NewRepository(ep.host+"/"+path, nopts...)
	if err != nil {
		return nil, fmt.Errorf("repository %s on %s: %w: %w", path, ep.display, err, errdefs.ErrInvalidArgument)
	}
	authr, withCreds, err := creds(ep, path)
	if err != nil {
		return nil, err
	}
	// One handshake (ping, token) per repository and pull, shared by the manifest
	// requests (go-containerregistry's remote) and the blob downloads: a
	// transport.Wrapper is used by remote as is.
	tr, err := transport.NewWithContext(ctx, repo.Registry, authr, p.transportFor(ep), []string{repo.Scope(transport.PullScope)})
	if err != nil {
		return nil, classify(err, ep, "repository "+path, withCreds)
	}
	return &source{ep: ep, repo: repo, tr: tr, client: &http.Client{Transport: tr}, withCreds: withCreds}, nil
}

// pullFrom pulls named from one endpoint, asked as asked (the reference the user gave,
// named is what it resolved to when a tag was resolved elsewhere). Each phase is a span
// of ctx's trace: image.resolve, image.verify, image.manifest, image.config, and an
// image.layer per layer.
func (p *Puller) pullFrom(ctx context.Context, asked, named reference.Named, ep endpoint, creds credsFunc, stats *pullStats, unpacker Unpacker) (*Image, error) {
	what := "image " + named.String()
	src, b, desc, err := p.resolveOn(ctx, named, ep, creds, what)
	if err != nil {
		return nil, err
	}
	if err := p.checkPolicy(ctx, asked, desc.Digest, src); err != nil {
		return nil, err
	}
	img, m, err := p.platformManifest(ctx, src, what, b, desc)
	if err != nil {
		return nil, err
	}
	if err := p.fetchConfig(ctx, src, m, img, stats); err != nil {
		return nil, err
	}

	if err := p.checkSpace(m.Layers); err != nil {
		return nil, err
	}
	var layerFn LayerFunc
	if unpacker != nil {
		layerFn = unpacker(img.Layers)
	} else {
		layerFn = func(ctx context.Context, _ int, _ Layer, fetch FetchFunc) error {
			_, err := fetch(ctx, nil)
			return err
		}
	}
	// Every layer gets its goroutine at once, so that a LayerFunc waiting for a lower
	// layer holds no download slot; the slots bound the downloads themselves.
	slots := make(chan struct{}, p.maxDownloads)
	g, gctx := errgroup.WithContext(ctx)
	for i, l := range img.Layers {
		desc := m.Layers[i]
		fetch := func(ctx context.Context, consume func(io.Reader) error) (bool, error) {
			streamed, err := p.fetchLayer(ctx, src, desc, stats, slots, consume)
			if err != nil {
				return streamed, fmt.Errorf("fetch layer %s: %w", desc.Digest, err)
			}
			return streamed, nil
		}
		g.Go(func() error {
			// The layer's span is the parent of its download and of what layerFn does
			// with it (the image package's unpack and commit).
			lctx, span := tracing.Start(gctx, spanLayer)
			if span.IsRecording() {
				span.SetAttributes(l.Attributes()...)
				span.SetAttributes(attrLayerIndex.Int(i))
			}
			err := layerFn(lctx, i, l, fetch)
			tracing.End(span, err)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return img, nil
}

// resolveOn opens named's repository on ep (the ping and token handshake) and gets the
// manifest or index named refers to: span image.resolve.
func (p *Puller) resolveOn(ctx context.Context, named reference.Named, ep endpoint, creds credsFunc, what string) (src *source, b []byte, desc manifestDesc, err error) {
	ctx, span := tracing.Start(ctx, spanResolve)
	defer tracing.Finish(span, &err)
	if span.IsRecording() {
		setEndpoint(span, ep)
		span.SetAttributes(attrRef.String(named.String()))
	}
	src, err = p.open(ctx, named, ep, creds)
	if err != nil {
		return nil, nil, manifestDesc{}, err
	}
	var gref name.Reference
	if d, ok := named.(reference.Digested); ok {
		gref = src.repo.Digest(d.Digest().String())
	} else {
		gref = src.repo.Tag(named.(reference.Tagged).Tag())
	}
	b, desc, err = p.getManifest(ctx, src, gref, what)
	if err != nil {
		return nil, nil, manifestDesc{}, err
	}
	if span.IsRecording() {
		span.SetAttributes(attrDigest.String(desc.Digest.String()), attrMediaType.String(desc.MediaType))
	}
	return src, b, desc, nil
}

// platformManifest walks from the manifest or index b (described by desc) to the
// manifest of the configured platform, checks it and stores what it read: span
// image.manifest. img has the index and manifest digests.
func (p *Puller) platformManifest(ctx context.Context, src *source, what string, b []byte, desc manifestDesc) (img *Image, m *ocispec.Manifest, err error) {
	ctx, span := tracing.Start(ctx, spanManifest)
	defer tracing.Finish(span, &err)
	repo := src.repo
	img = &Image{}
	for depth := 0; isIndex(desc.MediaType); depth++ {
		if depth == maxIndexDepth {
			return nil, nil, fmt.Errorf("%s: indexes nested more than %d deep: %w", what, maxIndexDepth, errdefs.ErrNotImplemented)
		}
		if depth == 0 {
			img.IndexDigest = desc.Digest
		}
		var idx ocispec.Index
		if err := json.Unmarshal(b, &idx); err != nil {
			return nil, nil, fmt.Errorf("%s: index %s is not valid JSON: %w: %w", what, desc.Digest, err, errdefs.ErrInvalidArgument)
		}
		if err := p.store(ctx, desc.Digest, desc.Size, bytes.NewReader(b)); err != nil {
			return nil, nil, fmt.Errorf("store index %s: %w", desc.Digest, err)
		}
		child, err := selectManifest(&idx, p.platform)
		if err != nil {
			return nil, nil, fmt.Errorf("%s (index %s): %w: %w", what, desc.Digest, err, errdefs.ErrNotFound)
		}
		if err := child.Digest.Validate(); err != nil {
			return nil, nil, fmt.Errorf("%s: index %s names an invalid digest %q: %w", what, desc.Digest, child.Digest, errdefs.ErrInvalidArgument)
		}
		what = "manifest " + child.Digest.String()
		b, desc, err = p.getManifest(ctx, src, repo.Digest(child.Digest.String()), what)
		if err != nil {
			return nil, nil, err
		}
		if desc.Size != child.Size {
			return nil, nil, fmt.Errorf("%s: %d bytes, but the index says %d: %w", what, desc.Size, child.Size, errdefs.ErrFailedPrecondition)
		}
	}
	switch desc.MediaType {
	case ocispec.MediaTypeImageManifest, mediaTypeDockerManifest:
	case mediaTypeDockerSchema1, mediaTypeDockerSchema1JWS:
		return nil, nil, fmt.Errorf("%s: Docker schema 1 manifests are not supported (deprecated since 2017); push the image again with a current client: %w", what, errdefs.ErrNotImplemented)
	default:
		return nil, nil, fmt.Errorf("%s: unsupported manifest media type %q: %w", what, desc.MediaType, errdefs.ErrNotImplemented)
	}
	img.ManifestDigest = desc.Digest
	if span.IsRecording() {
		span.SetAttributes(attrManifestDigest.String(desc.Digest.String()), attrMediaType.String(desc.MediaType))
		if img.IndexDigest != "" {
			span.SetAttributes(attrIndexDigest.String(img.IndexDigest.String()), attrPlatform.String(platformString(p.platform)))
		}
	}

	m = &ocispec.Manifest{}
	if err := json.Unmarshal(b, m); err != nil {
		return nil, nil, fmt.Errorf("%s: not valid JSON: %w: %w", what, err, errdefs.ErrInvalidArgument)
	}
	if err := checkManifest(m); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", what, err)
	}
	if err := p.store(ctx, desc.Digest, desc.Size, bytes.NewReader(b)); err != nil {
		return nil, nil, fmt.Errorf("store manifest %s: %w", desc.Digest, err)
	}
	if span.IsRecording() {
		span.SetAttributes(attrLayers.Int(len(m.Layers)))
	}
	return img, m, nil
}

// fetchConfig gets the config of manifest m into the store and checks its diff IDs
// against the layers, before anything large is downloaded: span image.config. It
// fills in img's config digest and layers.
func (p *Puller) fetchConfig(ctx context.Context, src *source, m *ocispec.Manifest, img *Image, stats *pullStats) (err error) {
	ctx, span := tracing.Start(ctx, spanConfig)
	defer tracing.Finish(span, &err)
	if span.IsRecording() {
		span.SetAttributes(attrImageID.String(m.Config.Digest.String()), attrBlobSize.Int64(m.Config.Size))
	}
	// An oversized config or manifest is the image's fault, as every other refusal of
	// its content is: InvalidArgument (not OutOfRange, which the CRI does not expect).
	if m.Config.Size > maxConfigSize {
		return fmt.Errorf("image config %s is %d bytes, more than the %d crisp reads (real ones are a few KiB): %w", m.Config.Digest, m.Config.Size, maxConfigSize, errdefs.ErrInvalidArgument)
	}
	if err := p.fetch(ctx, src, m.Config, stats); err != nil {
		return fmt.Errorf("fetch config %s: %w", m.Config.Digest, err)
	}
	cb, err := p.cs.ReadAll(m.Config.Digest, maxConfigSize)
	if err != nil {
		return fmt.Errorf("read config %s: %w", m.Config.Digest, err)
	}
	img.ConfigMediaType = m.Config.MediaType
	if IsWasmArtifact(m.Config.MediaType) {
		layers, err := wasmLayers(m, cb)
		if err != nil {
			return err
		}
		img.ConfigDigest = m.Config.Digest
		img.Layers = layers
		return nil
	}
	var cfg ocispec.Image
	if err := json.Unmarshal(cb, &cfg); err != nil {
		return fmt.Errorf("config %s: not valid JSON: %w: %w", m.Config.Digest, err, errdefs.ErrInvalidArgument)
	}
	if cfg.RootFS.Type != "layers" || len(cfg.RootFS.DiffIDs) != len(m.Layers) {
		return fmt.Errorf("config %s: rootfs has %d diff IDs (type %q) for %d layers: %w",
			m.Config.Digest, len(cfg.RootFS.DiffIDs), cfg.RootFS.Type, len(m.Layers), errdefs.ErrInvalidArgument)
	}
	for _, d := range cfg.RootFS.DiffIDs {
		if err := d.Validate(); err != nil {
			return fmt.Errorf("config %s: invalid diff ID %q: %w: %w", m.Config.Digest, d, err, errdefs.ErrInvalidArgument)
		}
	}
	img.ConfigDigest = m.Config.Digest
	img.Layers = make([]Layer, len(m.Layers))
	for i, l := range m.Layers {
		img.Layers[i] = Layer{Digest: l.Digest, Size: l.Size, MediaType: l.MediaType, DiffID: cfg.RootFS.DiffIDs[i]}
	}
	return nil
}

// fetchLayer is a layer's FetchFunc: fetch in one of the pull's download slots, with
// consume fed as the blob downloads when this pull is the one downloading it.
func (p *Puller) fetchLayer(ctx context.Context, src *source, desc ocispec.Descriptor, stats *pullStats, slots chan struct{}, consume func(io.Reader) error) (streamed bool, err error) {
	if p.cs.Has(desc.Digest) {
		return false, nil
	}
	select {
	case slots <- struct{}{}:
	case <-ctx.Done():
		return false, ctx.Err()
	}
	defer func() { <-slots }()
	var tee *teeConsumer
	if consume != nil {
		tee = startConsumer(consume)
	}
	err = p.fetchWith(ctx, src, desc, stats, tee)
	if tee == nil {
		return false, err
	}
	streamed, cerr := tee.finish(err)
	if err == nil && cerr != nil {
		err = cerr
	}
	return streamed, err
}

// checkSpace refuses, before anything large is downloaded, layers whose blobs would
// leave less than the reserve free. The blobs' sizes are known; what they unpack to is
// not, and the unpack checks as it goes.
func (p *Puller) checkSpace(layers []ocispec.Descriptor) error {
	if !p.reserve.Enabled() {
		return nil
	}
	var need int64
	missing := 0
	for _, l := range layers {
		if !p.cs.Has(l.Digest) {
			need += l.Size
			missing++
		}
	}
	return p.reserve.Check(need, fmt.Sprintf("downloading %d layers", missing))
}

// checkManifest refuses a manifest crisp could not run before anything is downloaded.
func checkManifest(m *ocispec.Manifest) error {
	if m.SchemaVersion != 2 {
		return fmt.Errorf("schemaVersion %d, want 2: %w", m.SchemaVersion, errdefs.ErrNotImplemented)
	}
	switch m.Config.MediaType {
	case ocispec.MediaTypeImageConfig, mediaTypeDockerConfig:
	case MediaTypeWasmConfig:
		if err := checkWasmManifest(m); err != nil {
			return err
		}
	default:
		return fmt.Errorf("not a container image: config media type %q: %w", m.Config.MediaType, errdefs.ErrNotImplemented)
	}
	descs := append([]ocispec.Descriptor{m.Config}, m.Layers...)
	for i, d := range descs {
		if err := d.Digest.Validate(); err != nil {
			return fmt.Errorf("invalid digest %q: %w: %w", d.Digest, err, errdefs.ErrInvalidArgument)
		}
		if d.Size < 0 {
			return fmt.Errorf("blob %s has negative size %d: %w", d.Digest, d.Size, errdefs.ErrInvalidArgument)
		}
		if i > 0 && !layerMediaTypes[d.MediaType] && !IsWasmArtifact(m.Config.MediaType) {
			return fmt.Errorf("layer %s has unsupported media type %q: %w", d.Digest, d.MediaType, errdefs.ErrNotImplemented)
		}
	}
	return nil
}

// manifestDesc is what getManifest learned about a manifest.
type manifestDesc struct {
	Digest    digest.Digest
	Size      int64
	MediaType string
}

// getManifest fetches a manifest or index with go-containerregistry's remote, which
// checks it against the digest when ref is a digest.
func (p *Puller) getManifest(ctx context.Context, src *source, ref name.Reference, what string) ([]byte, manifestDesc, error) {
	d, err := remote.Get(ref, remote.WithContext(ctx), remote.WithTransport(src.tr))
	if err != nil {
		return nil, manifestDesc{}, classify(err, src.ep, what, src.withCreds)
	}
	if len(d.Manifest) > maxManifestSize {
		return nil, manifestDesc{}, fmt.Errorf("%s: manifest of %d bytes is larger than the %d allowed: %w", what, len(d.Manifest), maxManifestSize, errdefs.ErrInvalidArgument)
	}
	return d.Manifest, manifestDesc{
		Digest:    digest.Digest(d.Digest.String()),
		Size:      d.Size,
		MediaType: manifestMediaType(string(d.MediaType), d.Manifest),
	}, nil
}

// manifestMediaType returns the media type of a manifest: the Content-Type the
// registry sent if it is a manifest type, else the document's own mediaType field,
// else what its shape says (OCI allows omitting mediaType).
func manifestMediaType(contentType string, b []byte) string {
	ct, _, _ := strings.Cut(contentType, ";")
	ct = strings.TrimSpace(ct)
	switch ct {
	case ocispec.MediaTypeImageManifest, ocispec.MediaTypeImageIndex, mediaTypeDockerManifest,
		mediaTypeDockerManifestList, mediaTypeDockerSchema1, mediaTypeDockerSchema1JWS:
		return ct
	}
	var probe struct {
		SchemaVersion int               `json:"schemaVersion"`
		MediaType     string            `json:"mediaType"`
		Manifests     json.RawMessage   `json:"manifests"`
		Config        json.RawMessage   `json:"config"`
		FSLayers      []json.RawMessage `json:"fsLayers"`
	}
	if json.Unmarshal(b, &probe) != nil {
		return ct
	}
	switch {
	case probe.MediaType != "":
		return probe.MediaType
	case probe.SchemaVersion == 1 || probe.FSLayers != nil:
		return mediaTypeDockerSchema1
	case probe.Manifests != nil:
		return ocispec.MediaTypeImageIndex
	case probe.Config != nil:
		return ocispec.MediaTypeImageManifest
	}
	return ct
}

func isIndex(mediaType string) bool {
	return mediaType == ocispec.MediaTypeImageIndex || mediaType == mediaTypeDockerManifestList
}

// fetch makes sure blob desc is in the content store, downloading it from src unless
// it is there already or another pull is downloading it (then it waits for that
// download). If the shared download fails (it may come from another registry, with
// other credentials) this pull tries once with its own source.
func (p *Puller) fetch(ctx context.Context, src *source, desc ocispec.Descriptor, stats *pullStats) error {
	return p.fetchWith(ctx, src, desc, stats, nil)
}

// fetchWith is fetch with the bytes also fed to tee when this call's flight downloads
// them.
func (p *Puller) fetchWith(ctx context.Context, src *source, desc ocispec.Descriptor, stats *pullStats, tee *teeConsumer) error {
	if p.cs.Has(desc.Digest) {
		return nil
	}
	for attempt := 0; ; attempt++ {
		shared, err := p.flights.do(ctx, desc.Digest, func(fctx context.Context) error {
			if p.cs.Has(desc.Digest) {
				return nil // finished by a flight that ended just before this one began
			}
			return p.download(fctx, src, desc, stats, tee)
		})
		// A stalled download is not tried again by the pulls that shared it: each
		// would wait out the timeout anew.
		if err == nil || !shared || attempt > 0 || ctx.Err() != nil || IsStalled(err) {
			return err
		}
		p.log.Debug("shared download failed, downloading again", "digest", desc.Digest, "err", err)
	}
}

// download streams one blob from src into the content store, which verifies it.
// It is span image.layer.download (image.blob.download for a config), from the
// request to the last byte stored, whose bytes are those read from the registry.
func (p *Puller) download(ctx context.Context, src *source, desc ocispec.Descriptor, stats *pullStats, tee *teeConsumer) (err error) {
	name := spanBlobFetch
	if layerMediaTypes[desc.MediaType] || desc.MediaType == MediaTypeWasmLayer {
		name = spanLayerFetch
	}
	ctx, span := tracing.Start(ctx, name)
	var conn *connReader
	defer func() {
		if span.IsRecording() {
			setEndpoint(span, src.ep)
			span.SetAttributes(attrBlobDigest.String(desc.Digest.String()), attrBlobSize.Int64(desc.Size),
				attrMediaType.String(desc.MediaType))
			if conn != nil {
				span.SetAttributes(attrBytesRead.Int64(conn.read))
			}
		}
		tracing.End(span, err)
	}()
	start := time.Now()
	u := url.URL{
		Scheme: src.repo.Scheme(),
		Host:   src.repo.RegistryStr(),
		Path:   "/v2/" + src.repo.RepositoryStr() + "/blobs/" + desc.Digest.String(),
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	resp, err := src.client.Do(req)
	if err != nil {
		return classify(err, src.ep, "blob "+desc.Digest.String(), src.withCreds)
	}
	defer resp.Body.Close()
	if err := transport.CheckError(resp, http.StatusOK); err != nil {
		return classify(err, src.ep, "blob "+desc.Digest.String(), src.withCreds)
	}
	if resp.ContentLength >= 0 && resp.ContentLength != desc.Size {
		return fmt.Errorf("%s announced %d bytes, but the manifest says %d: %w",
			src.ep.display, resp.ContentLength, desc.Size, errdefs.ErrFailedPrecondition)
	}
	conn = &connReader{r: resp.Body, ep: src.ep, ctx: ctx}
	body := p.reserve.Reader(conn, "")
	if tee != nil {
		body = tee.reader(body)
	}
	if err := p.store(ctx, desc.Digest, desc.Size, body); err != nil {
		if errors.Is(err, context.Canceled) && ctx.Err() != nil {
			return ctx.Err()
		}
		return err
	}
	stats.blobs.Add(1)
	stats.bytes.Add(desc.Size)
	p.log.Debug("downloaded blob", "digest", desc.Digest, "size", desc.Size, "from", src.ep.display, "duration", time.Since(start))
	return nil
}

// store writes a blob to the content store, with fsyncs unless the caller defers them.
func (p *Puller) store(ctx context.Context, d digest.Digest, size int64, r io.Reader) error {
	if p.deferSync {
		return p.cs.WriteUnsynced(ctx, d, size, r)
	}
	return p.cs.Write(ctx, d, size, r)
}

// connReader is a blob download's response body. A read error is the connection's: the
// registry died or the network was cut mid-blob. That is Unavailable, worth a retry,
// unlike a body that ends cleanly but short or with the wrong digest (the content
// store's FailedPrecondition, as containerd's: the registry serves bad data). The
// caller's cancellation stays what it is.
type connReader struct {
	r    io.Reader
	ep   endpoint
	ctx  context.Context
	read int64
}

func (c *connReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.read += int64(n)
	if err != nil && err != io.EOF && c.ctx.Err() == nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) && !IsStalled(err) {
		err = fmt.Errorf("connection to %s lost after %d bytes (%w): %w", c.ep.where(), c.read, err, errdefs.ErrUnavailable)
	}
	return n, err
}
