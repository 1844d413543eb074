package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	"github.com/distribution/reference"
	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"go.opentelemetry.io/otel/trace"

	"github.com/crisp-runtime/crisp/internal/image/content"
	"github.com/crisp-runtime/crisp/internal/image/diskspace"
	"github.com/crisp-runtime/crisp/internal/image/remote"
	"github.com/crisp-runtime/crisp/internal/image/snapshot"
	"github.com/crisp-runtime/crisp/internal/metrics"
	"github.com/crisp-runtime/crisp/internal/store"
	"github.com/crisp-runtime/crisp/internal/tracing"
)

// Buckets of the metadata store.
const (
	imageBucket = "images"
	refBucket   = "image-refs"
)

// maxConfigSize bounds an image config read into memory; real ones are a few KiB.
const maxConfigSize = 8 << 20

// What a layer's stream may make a pull decompress and write before the blob's digest
// is checked: unverifiedRatio times the compressed size the manifest declares, and at
// least unverifiedFloor. Real layers inflate 2-6 times (binaries, libraries, text),
// metadata-only layers (a chown -R: tar headers alone) about 40 times; only long runs
// of one byte go further, up to gzip's 1032 times (a zero-filled file), and zstd's far
// beyond. A layer past the cap is not refused: its streamed unpack stops, the download
// goes on, and the blob is unpacked once the content store has verified it, as
// containerd unpacks every layer. So a man in the middle of a plain-HTTP mirror, whose
// blob fails its digest check at the end, makes a pull write at most this much per
// layer downloading at once, and a real but extreme layer only loses the overlap.
const (
	unverifiedRatio = 100
	unverifiedFloor = 16 << 20
)

// errUnverifiedLimit marks a streamed unpack stopped at unverifiedLimit.
var errUnverifiedLimit = errors.New("stopped before the blob is verified")

// unverifiedLimit is what the stream of a layer whose blob is declared size bytes may
// write before the blob is verified.
func unverifiedLimit(size int64) int64 {
	if size > math.MaxInt64/unverifiedRatio {
		return math.MaxInt64
	}
	return max(unverifiedRatio*size, unverifiedFloor)
}

// Config configures the image store.
type Config struct {
	// Root holds content/ and snapshots/.
	Root   string
	Remote remote.Config
	// Pinned references are reported pinned.
	Pinned []string
	// MinFreeBytes and MinFreePercent are the free space a pull must leave on the
	// filesystem holding Root (the larger applies; 0 disables each), checked before
	// and while blobs are downloaded and layers unpacked.
	MinFreeBytes   int64
	MinFreePercent float64
	// Metrics records pulls and reports the store's size; nil records nothing.
	Metrics *metrics.Metrics
}

// Image is one image in the store, identified by its config digest.
type Image struct {
	ID             string          `json:"id"`
	RepoTags       []string        `json:"repo_tags"`
	RepoDigests    []string        `json:"repo_digests"`
	ManifestDigest digest.Digest   `json:"manifest_digest"`
	IndexDigest    digest.Digest   `json:"index_digest,omitempty"`
	Layers         []remote.Layer  `json:"layers"`
	ChainIDs       []digest.Digest `json:"chain_ids"`
	Size           int64           `json:"size"`
	Config         json.RawMessage `json:"config"`
	Pulled         time.Time       `json:"pulled"`
}

// Spec decodes the image's OCI config (entrypoint, env, user, ...).
func (i *Image) Spec() (ocispec.Image, error) {
	var spec ocispec.Image
	if err := json.Unmarshal(i.Config, &spec); err != nil {
		return spec, fmt.Errorf("decode config of image %s: %w", i.ID, err)
	}
	return spec, nil
}

// TopChainID is the snapshot a container's rootfs is prepared on; empty for an image
// without layers.
func (i *Image) TopChainID() digest.Digest {
	if len(i.ChainIDs) == 0 {
		return ""
	}
	return i.ChainIDs[len(i.ChainIDs)-1]
}

// RepoDigest returns the "repository@sha256:..." reference that a container created
// from ref reports as ContainerStatus.image_ref (kubelet shows it as the pod's
// imageID): the repo digest of ref's own repository, so a container created from
// mirror.example/app:v1 names mirror.example/app even when the same image was pulled
// under other names too; the digest itself when ref is one of the image's repo
// digests; else the first repo digest, as containerd reports; else the image ID when
// the image has none. ref may be a tag, a digest reference, an ID or empty.
func (i *Image) RepoDigest(ref string) string {
	if named, err := remote.Normalize(ref); err == nil && !strings.HasPrefix(ref, "sha256:") {
		repo := reference.TrimNamed(named).String()
		if c, ok := named.(reference.Canonical); ok {
			if want := repo + "@" + c.Digest().String(); slices.Contains(i.RepoDigests, want) {
				return want
			}
		}
		for _, d := range i.RepoDigests {
			if r, _, _ := strings.Cut(d, "@"); r == repo {
				return d
			}
		}
	}
	if len(i.RepoDigests) > 0 {
		return i.RepoDigests[0]
	}
	return i.ID
}

func (i *Image) clone() *Image {
	c := *i
	c.RepoTags = append([]string(nil), i.RepoTags...)
	c.RepoDigests = append([]string(nil), i.RepoDigests...)
	return &c
}

// Service is the image store. It is safe for concurrent use.
type Service struct {
	// cfg is the configuration New was given; Reconfigure replaces the puller and
	// the pinned set, not cfg.Remote and cfg.Pinned, which nothing reads after New.
	cfg     Config
	store   *store.Store
	content *content.Store
	snaps   *snapshot.Snapshotter
	// puller is replaced whole by Reconfigure: a pull loads it once and finishes on
	// the one it loaded.
	puller  atomic.Pointer[remote.Puller]
	log     *slog.Logger
	reserve diskspace.Reserve

	// gcMu lets pulls run together but never while unreferenced content is freed, so
	// a blob a pull has just written is never collected before its image is recorded.
	gcMu sync.RWMutex

	mu     sync.RWMutex
	images map[string]*Image // by ID
	refs   map[string]string // tag or digest reference -> ID
	pinned map[string]bool   // normalized references and IDs; replaced whole by Reconfigure
}

// New opens the image store under cfg.Root and loads its metadata.
func New(cfg Config, st *store.Store, log *slog.Logger) (*Service, error) {
	cs, err := content.Open(filepath.Join(cfg.Root, "content"))
	if err != nil {
		return nil, fmt.Errorf("open content store: %w", err)
	}
	snaps, err := snapshot.Open(filepath.Join(cfg.Root, "snapshots"), st)
	if err != nil {
		return nil, fmt.Errorf("open snapshotter: %w", err)
	}
	s := &Service{
		cfg:     cfg,
		store:   st,
		content: cs,
		snaps:   snaps,
		log:     log,
		reserve: diskspace.Reserve{Path: cfg.Root, Bytes: cfg.MinFreeBytes, Percent: cfg.MinFreePercent},
		pinned:  pinnedSet(cfg.Pinned),
		images:  map[string]*Image{},
		refs:    map[string]string{},
	}
	s.puller.Store(s.newPuller(cfg.Remote))
	err = st.ForEach(imageBucket, func(id string, data []byte) error {
		var img Image
		if err := json.Unmarshal(data, &img); err != nil {
			return fmt.Errorf("decode image %s: %w", id, err)
		}
		s.images[id] = &img
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("load images: %w", err)
	}
	err = st.ForEach(refBucket, func(ref string, data []byte) error {
		var id string
		if err := json.Unmarshal(data, &id); err != nil {
			return fmt.Errorf("decode image ref %s: %w", ref, err)
		}
		s.refs[ref] = id
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("load image refs: %w", err)
	}
	// A pull cut short by a crash leaves whole blobs and unpacked layers that no image
	// record names (partial ones are removed by content.Open and snapshot.Open); no
	// pull runs yet, so whatever no image references can go.
	if _, err := s.gcLocked(context.Background()); err != nil {
		log.Warn("free content of interrupted pulls", "err", err)
	}
	cfg.Metrics.WatchImages(s.storeSize)
	return s, nil
}

// newPuller returns a puller with the registry settings rc and what the store itself
// requires of every puller, whatever the settings: its free-space reserve, and
// unsynced blob writes (pull flushes the store once for an image, and New frees
// unreferenced blobs).
func (s *Service) newPuller(rc remote.Config) *remote.Puller {
	rc.Reserve = s.reserve
	rc.DeferSync = true
	return remote.New(rc, s.content, s.log.With("component", "pull"))
}

// pinnedSet is the set Pinned looks references up in: each normalized as pulls
// record them, so "busybox" pins docker.io/library/busybox:latest. An image ID is
// kept as it is: Normalize would read "sha256:<hex>" as repository sha256 with a tag.
func pinnedSet(refs []string) map[string]bool {
	set := make(map[string]bool, len(refs))
	for _, p := range refs {
		if strings.HasPrefix(p, "sha256:") {
			set[p] = true
		} else if named, err := remote.Normalize(p); err == nil {
			set[named.String()] = true
		} else {
			set[p] = true
		}
	}
	return set
}

// Reconfigure applies new registry settings and a new list of pinned images, as a
// reload of criserver's config does. Pulls under way finish with the settings they
// started with; pulls that start afterwards use rc. Images already stored are not
// touched: only what Pinned reports changes.
func (s *Service) Reconfigure(rc remote.Config, pinned []string) {
	s.puller.Store(s.newPuller(rc))
	set := pinnedSet(pinned)
	s.mu.Lock()
	s.pinned = set
	s.mu.Unlock()
}

// storeSize counts the images and adds up their sizes, for metrics at scrape time.
func (s *Service) storeSize() (count int, bytes int64) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, img := range s.images {
		bytes += img.Size
	}
	return len(s.images), bytes
}

// Pull fetches ref into the store, unpacks its layers and records it under the
// reference it was pulled with. It returns the image.
//
// A pull that would leave less free space than the reserve, or that meets a full
// filesystem, fails with errdefs.ErrResourceExhausted naming the image and the space,
// and whatever it stored that no image needs is freed again (when no other pull is
// running; else the next removal frees it), so that the space comes back at once.
//
// The pull is span image.pull of ctx's trace, with a child per phase (see
// docs/tracing.md); the freeing after a failure is part of it.
func (s *Service) Pull(ctx context.Context, ref string, auth *remote.Auth) (_ *Image, err error) {
	ctx, span := tracing.Start(ctx, spanPull)
	defer tracing.Finish(span, &err)
	if span.IsRecording() {
		span.SetAttributes(attrRef.String(ref))
	}
	named, err := remote.Normalize(ref)
	if err != nil {
		return nil, err
	}
	name := named.String()
	start := time.Now()
	img, downloaded, err := s.pull(ctx, named, auth)
	if err == nil {
		s.cfg.Metrics.ObservePull(time.Since(start), downloaded, nil)
		if span.IsRecording() {
			setImageAttrs(span, img, downloaded)
		}
		return img, nil
	}
	s.cfg.Metrics.ObservePull(time.Since(start), 0, err)
	err = diskspace.Classify(err, s.cfg.Root)
	if errdefs.IsResourceExhausted(err) {
		s.freeAfterFullDisk(ctx, name, start, err)
	} else {
		s.freeAfterFailure(ctx, name, err)
	}
	return nil, err
}

// freeAfterFailure frees what a failed pull stored (the manifest, the config, layers
// that completed before another failed) and that no image references, so that a pull
// cut by a stalled registry, a refused signature or a bad layer leaves nothing behind.
func (s *Service) freeAfterFailure(ctx context.Context, name string, pullErr error) {
	if ran, err := s.freeUnreferenced(ctx); ran && err != nil {
		s.log.Warn("free what a failed pull stored", "ref", name, "pull_err", pullErr, "err", err)
	}
}

// freeUnreferenced frees the blobs and snapshots no image references, when no pull
// runs: another pull's blobs are unreferenced until its image is recorded. ran says
// whether it did; else the last of the pulls running frees them when it fails, or the
// next removal or start does.
func (s *Service) freeUnreferenced(ctx context.Context) (ran bool, err error) {
	if !s.gcMu.TryLock() {
		return false, nil
	}
	defer s.gcMu.Unlock()
	return true, s.gcTraced(context.WithoutCancel(ctx))
}

// freeAfterFullDisk frees what a pull refused for lack of space left behind (complete
// blobs and layers of an image that was never recorded) and logs the space it got back.
func (s *Service) freeAfterFullDisk(ctx context.Context, name string, start time.Time, pullErr error) {
	var free int64 = -1
	if sp, err := diskspace.Stat(s.cfg.Root); err == nil {
		free = sp.Free
	}
	ran, gcErr := s.freeUnreferenced(ctx)
	if !ran {
		s.log.Warn("pull refused: image filesystem full; other pulls are running, so what this one stored is freed when the last of them fails, or at the next image removal",
			"ref", name, "after", time.Since(start), "free_bytes", free, "err", pullErr)
		return
	}
	after := free
	if sp, err := diskspace.Stat(s.cfg.Root); err == nil {
		after = sp.Free
	}
	s.log.Warn("pull refused: image filesystem full; freed what it stored", "ref", name, "after", time.Since(start),
		"free_bytes", free, "free_bytes_after_cleanup", after, "err", pullErr, "cleanup_err", gcErr)
}

// pull is Pull under the pull lock, which keeps image removal's GC away. It also
// returns the bytes it downloaded from the registry.
func (s *Service) pull(ctx context.Context, named reference.Named, auth *remote.Auth) (*Image, int64, error) {
	name := named.String()
	s.gcMu.RLock()
	defer s.gcMu.RUnlock()

	start := time.Now()
	fetched, err := s.puller.Load().PullLayers(ctx, name, auth, func(layers []remote.Layer) remote.LayerFunc {
		return s.newLayerPull(name, layers).layer
	})
	if err != nil {
		return nil, 0, err
	}
	cfgBytes, err := s.content.ReadAll(fetched.ConfigDigest, maxConfigSize)
	if errdefs.IsOutOfRange(err) {
		// The puller refuses such a config before downloading it; this is the backstop.
		return nil, 0, fmt.Errorf("pull %s: image config %s is larger than the %d bytes allowed: %w", name, fetched.ConfigDigest, maxConfigSize, errdefs.ErrInvalidArgument)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("pull %s: read config: %w", name, err)
	}
	size := int64(len(cfgBytes))
	if remote.IsWasmArtifact(fetched.ConfigMediaType) {
		// The image keeps the wasm artifact's identity (its config digest) and
		// records the OCI image config the CRI reads (the entrypoint).
		if cfgBytes, err = wasmImageConfig(cfgBytes, fetched.Layers); err != nil {
			return nil, 0, fmt.Errorf("pull %s: %w", name, err)
		}
	}
	// The blobs and layers this pull stored are not flushed yet (those it found were,
	// or are flushed here too: syncfs covers the whole filesystem); until the image is
	// recorded nothing references them, and the next start frees them.
	if err := s.sync(ctx); err != nil {
		return nil, 0, fmt.Errorf("pull %s: %w", name, err)
	}
	diffIDs := make([]digest.Digest, len(fetched.Layers))
	for i, l := range fetched.Layers {
		diffIDs[i] = l.DiffID
	}
	chain := chainIDs(diffIDs)
	for _, l := range fetched.Layers {
		size += l.Size
	}
	img := &Image{
		ID:             fetched.ConfigDigest.String(),
		ManifestDigest: fetched.ManifestDigest,
		IndexDigest:    fetched.IndexDigest,
		Layers:         fetched.Layers,
		ChainIDs:       chain,
		Size:           size,
		Config:         cfgBytes,
		Pulled:         time.Now(),
	}
	var refs []string
	if t, ok := named.(reference.Tagged); ok {
		// For tag@digest the tag is recorded without the digest, as kubelet lists it.
		if tn, err := reference.WithTag(reference.TrimNamed(named), t.Tag()); err == nil {
			refs = append(refs, tn.String())
		}
	}
	if fetched.RepoDigest != "" {
		refs = append(refs, fetched.RepoDigest)
	}
	out, err := s.recordTraced(ctx, img, refs)
	if err != nil {
		return nil, 0, fmt.Errorf("pull %s: %w", name, err)
	}
	s.log.Info("image pulled", "ref", name, "id", img.ID, "size", size, "downloaded_bytes", fetched.Downloaded, "layers", len(fetched.Layers), "total", time.Since(start))
	return out, fetched.Downloaded, nil
}

// layerPull unpacks the layers of one pull (one endpoint's try) while they download:
// every layer downloads and unpacks at once, and each is committed as a snapshot only
// once the layer below it is, since its checks and the attributes of the directories
// it does not carry depend on the layers below.
type layerPull struct {
	s     *Service
	name  string
	chain []digest.Digest
	done  []chan struct{} // closed when layer i is committed or has failed
	errs  []error         // layer i's result, set before done[i] is closed
}

func (s *Service) newLayerPull(name string, layers []remote.Layer) *layerPull {
	diffIDs := make([]digest.Digest, len(layers))
	for i, l := range layers {
		diffIDs[i] = l.DiffID
	}
	lp := &layerPull{s: s, name: name, chain: chainIDs(diffIDs),
		done: make([]chan struct{}, len(layers)), errs: make([]error, len(layers))}
	for i := range lp.done {
		lp.done[i] = make(chan struct{})
	}
	return lp
}

// layer is the remote.LayerFunc of layer i. A layer whose snapshot exists needs its
// blob only. Otherwise the pull claims the snapshot (a concurrent pull sharing the
// layer waits for the claim, and finds the snapshot when it ends, so a layer is
// downloaded and unpacked once), unpacks the blob as it downloads (from the store if
// it is there already or another pull downloaded it), and commits it on the layer
// below.
func (lp *layerPull) layer(ctx context.Context, i int, l remote.Layer, fetch remote.FetchFunc) (err error) {
	defer func() {
		lp.errs[i] = err
		close(lp.done[i])
	}()
	claim, _, err := lp.s.snaps.Claim(ctx, lp.chain[i])
	if err != nil {
		return fmt.Errorf("pull %s: layer %s: %w", lp.name, l.Digest, err)
	}
	if claim == nil {
		if span := trace.SpanFromContext(ctx); span.IsRecording() {
			span.SetAttributes(attrSnapshotExists.Bool(true))
		}
		_, err := fetch(ctx, nil)
		return err
	}
	defer func() {
		// A stalled registry fails the pulls that waited for this one's claim too:
		// each would wait out the progress timeout anew, one after the other.
		if remote.IsStalled(err) {
			claim.Abandon(err)
		}
		claim.Release()
	}()
	var pending *snapshot.Pending
	var stopped error // the streamed unpack outgrew unverifiedLimit
	streamed, err := fetch(ctx, func(r io.Reader) error {
		var uerr error
		pending, uerr = lp.s.unpackLayer(ctx, lp.name, l, r, unverifiedLimit(l.Size))
		if errors.Is(uerr, errUnverifiedLimit) {
			// Not a fault yet: the download goes on, and a blob that verifies is
			// unpacked from the store below.
			lp.s.log.Info("layer inflates past what its stream may write unverified: it is unpacked once its blob is verified",
				"ref", lp.name, "layer", l.Digest, "size", l.Size, "limit", unverifiedLimit(l.Size), "why", uerr)
			stopped = uerr
			return nil
		}
		return uerr
	})
	if err != nil {
		if pending != nil {
			_ = pending.Discard()
		}
		if stopped != nil {
			return fmt.Errorf("%w; its unpack had been stopped: %v", err, stopped)
		}
		return err
	}
	if !streamed || stopped != nil {
		if pending, err = lp.s.unpackStored(ctx, lp.name, l); err != nil {
			return err
		}
	}
	var parent digest.Digest
	if i > 0 {
		parent = lp.chain[i-1]
		select {
		case <-lp.done[i-1]:
		case <-ctx.Done():
			_ = pending.Discard()
			return ctx.Err()
		}
		if lp.errs[i-1] != nil {
			// The pull fails with the lower layer's error; this one is only its echo.
			_ = pending.Discard()
			return fmt.Errorf("pull %s: layer %s: the layer below failed", lp.name, l.Digest)
		}
	}
	// Unsynced: pull flushes once for the image before recording it.
	cctx, span := tracing.Start(ctx, spanCommit)
	if span.IsRecording() {
		span.SetAttributes(attrLayerDigest.String(l.Digest.String()), attrChainID.String(lp.chain[i].String()),
			attrParent.String(parent.String()))
	}
	_, err = lp.s.snaps.CommitUnsynced(cctx, claim, pending, parent)
	tracing.End(span, err)
	if err != nil {
		return fmt.Errorf("pull %s: %w", lp.name, err)
	}
	return nil
}

// unpackStored unpacks layer l from its blob in the content store.
func (s *Service) unpackStored(ctx context.Context, name string, l remote.Layer) (*snapshot.Pending, error) {
	blob, err := s.content.Open(l.Digest)
	if err != nil {
		return nil, fmt.Errorf("pull %s: open layer %s: %w", name, l.Digest, err)
	}
	defer blob.Close()
	// Verified when it was stored: no limit but the reserve.
	return s.unpackLayer(ctx, name, l, blob, 0)
}

// unpackLayer unpacks the blob of layer l, read from r to its end, into a pending
// snapshot, verifying that its uncompressed content is the diff ID the config
// promises. Faults of the layer (an entry refused, corrupt compressed data, a truncated
// tar, the wrong diff ID) are errors wrapping errdefs.ErrInvalidArgument that name the
// image and the layer's digest; errors of r (the download's: a lost connection, a
// digest mismatch) are returned as they are. A limit above 0 bounds the bytes the
// unpack decompresses and the bytes its files declare (see unverifiedLimit): past it
// the unpack fails with an error wrapping errUnverifiedLimit, saying by how much,
// without the pull's and the layer's names (the caller adds them to another error).
//
// It is span image.layer.unpack; streamed unpacks overlap their layer's download.
func (s *Service) unpackLayer(ctx context.Context, name string, l remote.Layer, r io.Reader, limit int64) (_ *snapshot.Pending, retErr error) {
	ctx, span := tracing.Start(ctx, spanUnpack)
	defer tracing.Finish(span, &retErr)
	if span.IsRecording() {
		span.SetAttributes(l.Attributes()...)
		span.SetAttributes(attrStreamed.Bool(limit > 0))
	}
	var (
		raw io.ReadCloser
		err error
	)
	if isWasmLayer(l) {
		raw, err = wasmLayerTar(r, l)
	} else {
		raw, err = decompress(r)
	}
	if err != nil {
		return nil, fmt.Errorf("pull %s: layer %s: %w", name, l.Digest, err)
	}
	defer raw.Close()
	b := &unpackBudget{layer: l, limit: limit, reserve: s.reserve}
	verifier := l.DiffID.Algorithm().Digester()
	// The uncompressed size is known only once it is written: the reserve is checked
	// as the tar stream is read, which is as it is written out, and before each large
	// file, whose holes (a sparse file) are not in the stream.
	guarded := s.reserve.Reader(b.reader(raw), "")
	tee := io.TeeReader(guarded, verifier.Hash())
	// Unpack's error names the layer ("unpack layer sha256:…: refused entry …").
	pending, err := s.snaps.Unpack(ctx, l.Digest.String(), tee, snapshot.WithEntryCheck(b.entry))
	if b.err != nil && errors.Is(err, errUnverifiedLimit) {
		return nil, b.err
	}
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", name, err)
	}
	defer func() {
		if retErr != nil {
			if err := pending.Discard(); err != nil {
				s.log.Warn("remove the unpack of a bad layer", "layer", l.Digest, "err", err)
			}
		}
	}()
	// The tar end marker may come before the end of the stream: hash the rest too. For
	// a download this also waits for the blob's own digest to be checked.
	if _, err := io.Copy(io.Discard, tee); err != nil {
		if b.err != nil && errors.Is(err, errUnverifiedLimit) {
			return nil, b.err
		}
		return nil, fmt.Errorf("pull %s: layer %s: %w", name, l.Digest, err)
	}
	// The blob matched the manifest's digest, so a different diff ID is the image's own
	// contradiction (a broken build tool), not data lost on the way: InvalidArgument,
	// like every other fault of the image.
	// A wasm module layer has no diff ID of its own (remote.Layer.DiffID): its blob's
	// digest, checked as it was stored, is its check.
	if got := verifier.Digest(); got != l.DiffID && !isWasmLayer(l) {
		return nil, fmt.Errorf("pull %s: layer %s uncompresses to %s, but the image config says %s: the image is inconsistent: %w", name, l.Digest, got, l.DiffID, errdefs.ErrInvalidArgument)
	}
	return pending, nil
}

// chainIDs computes the OCI chain ID of every layer from the diff IDs.
func chainIDs(diffIDs []digest.Digest) []digest.Digest {
	out := make([]digest.Digest, len(diffIDs))
	for i, d := range diffIDs {
		if i == 0 {
			out[i] = d
			continue
		}
		sum := sha256.Sum256([]byte(out[i-1].String() + " " + d.String()))
		out[i] = digest.NewDigestFromEncoded(digest.SHA256, hex.EncodeToString(sum[:]))
	}
	return out
}

// record stores img (merging with an image of the same ID) and points refs at it. A
// tag that pointed at another image moves, as `docker pull` does.
func (s *Service) record(img *Image, refs []string) (*Image, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, ok := s.images[img.ID]
	if ok {
		cur = cur.clone()
		cur.Pulled = img.Pulled
		if cur.IndexDigest == "" {
			cur.IndexDigest = img.IndexDigest
		}
	} else {
		cur = img
	}
	changed := map[string]*Image{}
	for _, ref := range refs {
		if old, ok := s.refs[ref]; ok && old != img.ID {
			if prev := s.images[old]; prev != nil {
				prev = prev.clone()
				prev.RepoTags = without(prev.RepoTags, ref)
				prev.RepoDigests = without(prev.RepoDigests, ref)
				changed[old] = prev
			}
		}
		if strings.Contains(ref, "@") {
			cur.RepoDigests = appendUnique(cur.RepoDigests, ref)
		} else {
			cur.RepoTags = appendUnique(cur.RepoTags, ref)
		}
	}
	changed[cur.ID] = cur
	// One transaction: a failure (a full disk) must not leave an image without its
	// references, or a reference moved off an image the memory still shows with it.
	ops := make([]store.Op, 0, len(changed)+len(refs))
	for id, im := range changed {
		ops = append(ops, store.Op{Bucket: imageBucket, Key: id, Value: im})
	}
	for _, ref := range refs {
		ops = append(ops, store.Op{Bucket: refBucket, Key: ref, Value: cur.ID})
	}
	if err := s.store.Apply(ops...); err != nil {
		return nil, fmt.Errorf("record image %s: %w", cur.ID, err)
	}
	for id, im := range changed {
		s.images[id] = im
	}
	for _, ref := range refs {
		s.refs[ref] = cur.ID
	}
	return cur.clone(), nil
}

func appendUnique(list []string, v string) []string {
	for _, x := range list {
		if x == v {
			return list
		}
	}
	return append(list, v)
}

func without(list []string, v string) []string {
	out := list[:0:0]
	for _, x := range list {
		if x != v {
			out = append(out, x)
		}
	}
	return out
}

// Get finds an image by ID (with or without "sha256:", or a unique prefix of at least
// 12 hex digits), tag or digest reference. errdefs.ErrNotFound when there is none.
func (s *Service) Get(ref string) (*Image, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	img, _, err := s.resolveLocked(ref)
	if err != nil {
		return nil, err
	}
	return img.clone(), nil
}

// resolveLocked returns the image and the reference key that matched ("" for an ID).
func (s *Service) resolveLocked(ref string) (*Image, string, error) {
	if ref == "" {
		return nil, "", fmt.Errorf("image reference is empty: %w", errdefs.ErrInvalidArgument)
	}
	id := ref
	if !strings.HasPrefix(id, "sha256:") && isHex(id) && len(id) >= 12 {
		id = "sha256:" + id
	}
	if img, ok := s.images[id]; ok {
		return img, "", nil
	}
	if strings.HasPrefix(id, "sha256:") && isHex(id[7:]) && len(id) >= 7+12 {
		var found *Image
		for iid, img := range s.images {
			if strings.HasPrefix(iid, id) {
				if found != nil {
					return nil, "", fmt.Errorf("image id prefix %q is ambiguous: %w", ref, errdefs.ErrInvalidArgument)
				}
				found = img
			}
		}
		if found != nil {
			return found, "", nil
		}
		return nil, "", fmt.Errorf("image %q: %w", ref, errdefs.ErrNotFound)
	}
	named, err := remote.Normalize(ref)
	if err != nil {
		return nil, "", err
	}
	keys := []string{named.String()}
	if c, ok := named.(reference.Canonical); ok {
		// tag@digest: the digest decides.
		if d, err := reference.WithDigest(reference.TrimNamed(named), c.Digest()); err == nil {
			keys = []string{d.String()}
		}
	}
	for _, k := range keys {
		if id, ok := s.refs[k]; ok {
			if img := s.images[id]; img != nil {
				return img, k, nil
			}
		}
	}
	// A digest reference may name the platform manifest rather than the index.
	if c, ok := named.(reference.Canonical); ok {
		for _, img := range s.images {
			if img.ManifestDigest == c.Digest() || img.IndexDigest == c.Digest() {
				return img, "", nil
			}
		}
	}
	return nil, "", fmt.Errorf("image %q: %w", ref, errdefs.ErrNotFound)
}

func isHex(s string) bool {
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return s != ""
}

// List returns every image, oldest pull first.
func (s *Service) List() []*Image {
	s.mu.RLock()
	out := make([]*Image, 0, len(s.images))
	for _, img := range s.images {
		out = append(out, img.clone())
	}
	s.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Pulled.Before(out[j].Pulled) })
	return out
}

// Pinned reports whether kubelet's image GC must leave img alone.
func (s *Service) Pinned(img *Image) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.pinned[img.ID] {
		return true
	}
	for _, r := range slices.Concat(img.RepoTags, img.RepoDigests) {
		if s.pinned[r] {
			return true
		}
	}
	return false
}

// Remove removes ref: a tag of an image with other tags only loses that tag; anything
// else removes the image, and blobs and snapshots no image needs any more are freed.
// An unknown image is not an error. An image a view (an image volume) mounts is
// refused with errdefs.ErrFailedPrecondition.
//
// It is span image.remove, with the freeing as its child image.gc.
func (s *Service) Remove(ctx context.Context, ref string) (err error) {
	ctx, span := tracing.Start(ctx, spanRemove)
	defer tracing.Finish(span, &err)
	if span.IsRecording() {
		span.SetAttributes(attrRef.String(ref))
	}
	s.gcMu.Lock()
	defer s.gcMu.Unlock()
	s.mu.Lock()
	img, key, err := s.resolveLocked(ref)
	if errdefs.IsNotFound(err) {
		s.mu.Unlock()
		return nil
	}
	if err != nil {
		s.mu.Unlock()
		return err
	}
	if key != "" && !strings.Contains(key, "@") && len(img.RepoTags) > 1 {
		next := img.clone()
		next.RepoTags = without(next.RepoTags, key)
		err := s.store.Put(imageBucket, img.ID, next)
		if err == nil {
			err = s.store.Delete(refBucket, key)
		}
		if err == nil {
			s.images[img.ID] = next
			delete(s.refs, key)
		}
		s.mu.Unlock()
		return err
	}
	// The image itself goes: not while a container mounts it as a volume.
	if err := s.checkNoViewsLocked(img.ID); err != nil {
		s.mu.Unlock()
		return err
	}
	for r, id := range s.refs {
		if id == img.ID {
			if err := s.store.Delete(refBucket, r); err != nil {
				s.mu.Unlock()
				return err
			}
			delete(s.refs, r)
		}
	}
	if err := s.store.Delete(imageBucket, img.ID); err != nil {
		s.mu.Unlock()
		return err
	}
	delete(s.images, img.ID)
	s.mu.Unlock()
	s.log.Info("image removed", "id", img.ID, "ref", ref)
	if span.IsRecording() {
		span.SetAttributes(attrImageID.String(img.ID))
	}
	return s.gcTraced(ctx)
}

// gcFreed is what one gcLocked removed.
type gcFreed struct{ blobs, snapshots int }

// gcLocked frees blobs and snapshots no image references; gcMu must be held.
func (s *Service) gcLocked(ctx context.Context) (gcFreed, error) {
	var freed gcFreed
	s.mu.RLock()
	blobs := map[digest.Digest]bool{}
	chains := map[digest.Digest]bool{}
	for _, img := range s.images {
		blobs[digest.Digest(img.ID)] = true
		blobs[img.ManifestDigest] = true
		if img.IndexDigest != "" {
			blobs[img.IndexDigest] = true
		}
		for _, l := range img.Layers {
			blobs[l.Digest] = true
		}
		for _, c := range img.ChainIDs {
			chains[c] = true
		}
	}
	// A mounted view keeps its layers whatever happens to the image records.
	views, err := s.viewsLocked()
	for _, v := range views {
		chains[v.ChainID] = true
	}
	s.mu.RUnlock()
	if err != nil {
		return freed, err
	}
	var errs []error
	err = s.content.Walk(func(d digest.Digest, _ int64) error {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !blobs[d] {
			if err := s.content.Delete(d); err != nil {
				errs = append(errs, err)
			} else {
				freed.blobs++
			}
		}
		return nil
	})
	if err != nil {
		errs = append(errs, err)
	}
	// Snapshots go children first: repeat until a pass removes nothing.
	for {
		infos, err := s.snaps.List()
		if err != nil {
			errs = append(errs, err)
			break
		}
		parents := map[digest.Digest]bool{}
		for _, in := range infos {
			if in.Parent != "" {
				parents[in.Parent] = true
			}
		}
		removed := 0
		for _, in := range infos {
			if chains[in.ChainID] || parents[in.ChainID] {
				continue
			}
			if err := s.snaps.Remove(in.ChainID); err != nil {
				if !errdefs.IsFailedPrecondition(err) {
					errs = append(errs, err)
				}
				continue
			}
			removed++
		}
		freed.snapshots += removed
		if removed == 0 {
			break
		}
	}
	return freed, errors.Join(errs...)
}

// FsInfo reports the image filesystem: its mount point and what the store uses on it.
func (s *Service) FsInfo() (mountpoint string, bytes, inodes int64, err error) {
	cb, ci, err := s.content.Usage()
	if err != nil {
		return "", 0, 0, err
	}
	sb, si, err := s.snaps.Usage()
	if err != nil {
		return "", 0, 0, err
	}
	return mountPointOf(s.cfg.Root), cb + sb, ci + si, nil
}

// PrepareRootfs creates the writable snapshot key on top of image's layers and returns
// how to mount it.
func (s *Service) PrepareRootfs(key string, img *Image) ([]snapshot.Mount, error) {
	return s.snaps.Prepare(key, img.TopChainID())
}

// RemoveRootfs removes the writable snapshot key; unknown keys are not an error.
func (s *Service) RemoveRootfs(key string) error { return s.snaps.RemoveActive(key) }

// RootfsKeys lists the keys of every writable rootfs, so that recovery can remove
// those no container owns (a CreateContainer cut short by a crash).
func (s *Service) RootfsKeys() ([]string, error) { return s.snaps.ActiveKeys() }

// RootfsUsage reports what a container wrote into its writable snapshot key (bytes and
// inodes of the upper dir) and the mount point of the filesystem holding it, the one
// ImageFsInfo reports. The walk is costly: callers cache it.
func (s *Service) RootfsUsage(key string) (mountpoint string, bytes, inodes int64, err error) {
	bytes, inodes, err = s.snaps.ActiveUsage(key)
	if err != nil {
		return "", 0, 0, err
	}
	return mountPointOf(s.cfg.Root), bytes, inodes, nil
}

// mountPointOf returns the mount point of the filesystem holding path.
func mountPointOf(path string) string {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return path
	}
	best := "/"
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := f[4]
		if (path == mp || strings.HasPrefix(path, strings.TrimSuffix(mp, "/")+"/")) && len(mp) > len(best) {
			best = mp
		}
	}
	return best
}
