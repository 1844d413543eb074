package cri

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/pkg/archive"
	"github.com/containerd/containerd/v2/pkg/archive/compression"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/controller"
	"github.com/crisp-runtime/crisp/internal/image"
)

// Files of a checkpoint archive. The layout is CRI-O's and containerd's (checkpointctl
// reads all three): CRIU images under checkpoint/, CRIU's logs and statistics at the
// top, the container's metadata as *.dump, the writable layer's changes.
const (
	cpImagesDir   = "checkpoint"      // CRIU images and libcontainer's descriptors.json
	cpConfigDump  = "config.dump"     // checkpointctl's ContainerConfig (image, name, times)
	cpSpecDump    = "spec.dump"       // the OCI spec the container ran with
	cpStatusDump  = "status.dump"     // the CRI ContainerStatus at checkpoint time
	cpRootfsDiff  = "rootfs-diff.tar" // the writable layer's changes, an OCI layer tar
	cpDeletedList = "deleted.files"   // JSON list of paths the container deleted
	// cpCRIConfig is crisp's own: the CRI ContainerConfig the container was created
	// with (protojson), so a restore gets the same process, mounts and security context.
	cpCRIConfig = "container-config.dump"
	// criuInventory is the first file CRIU writes; an archive without it has no dump.
	criuInventory = "inventory.img"
)

// checkpointMeta is config.dump: checkpointctl's metadata.ContainerConfig.
type checkpointMeta struct {
	ID              string    `json:"id"`
	Name            string    `json:"name"`
	RootfsImage     string    `json:"rootfsImage,omitempty"`
	RootfsImageRef  string    `json:"rootfsImageRef,omitempty"`
	RootfsImageName string    `json:"rootfsImageName,omitempty"`
	OCIRuntime      string    `json:"runtime,omitempty"`
	CreatedTime     time.Time `json:"createdTime"`
	CheckpointedAt  time.Time `json:"checkpointedTime"`
	RestoredAt      time.Time `json:"restoredTime"`
	Restored        bool      `json:"restored"`
}

// CheckpointContainer dumps a running container with CRIU into a tar archive at the
// request's location; the container keeps running (kubelet's forensic checkpoints).
// The archive carries the CRIU images, the container's spec, config and status, and
// the changes of its writable layer; CreateContainer with the archive's path as the
// image restores it. timeout (seconds) bounds the whole call.
func (s *Service) CheckpointContainer(ctx context.Context, req *runtime.CheckpointContainerRequest) (_ *runtime.CheckpointContainerResponse, retErr error) {
	defer func() { retErr = toStatus(retErr) }()
	start := time.Now()
	c, err := s.resolveContainer(req.GetContainerId())
	if err != nil {
		return nil, err
	}
	location, err := checkpointLocation(req.GetLocation())
	if err != nil {
		return nil, err
	}
	if t := req.GetTimeout(); t > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, criTimeout(t))
		defer cancel()
	} else if t < 0 {
		return nil, invalid("timeout %d must not be negative", t)
	}
	c.op.Lock()
	defer c.op.Unlock()
	rec := c.snapshot()
	if rec.State != stateRunning {
		return nil, fmt.Errorf("container %s is %s: only running containers can be checkpointed: %w", rec.ID, rec.State, errdefs.ErrFailedPrecondition)
	}
	log := s.log.With("container", rec.ID, "location", location)

	// The CRIU images are staged under the root dir (they can be as large as the
	// container's memory: not for the state dir's tmpfs).
	parent := filepath.Join(s.cfg.RootDir, "checkpoints")
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return nil, fmt.Errorf("checkpoint staging dir: %w", err)
	}
	staging, err := os.MkdirTemp(parent, rec.ID+"-")
	if err != nil {
		return nil, fmt.Errorf("checkpoint staging dir: %w", err)
	}
	defer os.RemoveAll(staging)
	cp, err := s.captureContainer(ctx, c, rec, staging)
	if err != nil {
		return nil, err
	}

	// The archive: written next to the location and renamed over it, so a failed or
	// timed-out checkpoint leaves nothing, and a symlink at the location is replaced,
	// never followed.
	size, err := writeArchive(ctx, staging, location)
	if err != nil {
		return nil, fmt.Errorf("checkpoint container %s: %w", rec.ID, err)
	}
	log.Info("container checkpointed", "archive_bytes", size, "deleted_files", cp.deleted,
		"criu", cp.criu, "duration", time.Since(start))
	return &runtime.CheckpointContainerResponse{}, nil
}

// capture is what captureContainer measured.
type capture struct {
	criu    time.Duration // CRIU's dump, as the shim ran it
	deleted int           // paths the container deleted from its image
}

// captureContainer writes everything a checkpoint archive holds into staging (an
// empty directory): CRIU's images of the running container (which keeps running, or
// stays paused if it was), its metadata and its writable layer's changes. The caller
// holds c.op. CheckpointContainer and CheckpointPod both capture through here.
func (s *Service) captureContainer(ctx context.Context, c *container, rec containerRecord, staging string) (capture, error) {
	start := time.Now()
	if err := s.ctrl.CheckpointContainer(ctx, controller.CheckpointSpec{
		SandboxID: rec.PodID, ID: rec.ID, ImagesDir: filepath.Join(staging, cpImagesDir), WorkDir: staging,
	}); err != nil {
		return capture{}, err
	}
	dumped := time.Now()
	st, _ := s.containerStatus(c)
	if err := writeCheckpointMeta(staging, s.ctrl.ContainerBundle(rec.ID), c, rec, st, dumped); err != nil {
		return capture{}, fmt.Errorf("checkpoint container %s: %w", rec.ID, err)
	}
	deleted, err := writeRootfsDiff(ctx, s.images, rec.ID, staging)
	if err != nil {
		return capture{}, fmt.Errorf("checkpoint container %s: %w", rec.ID, err)
	}
	return capture{criu: dumped.Sub(start), deleted: len(deleted)}, nil
}

// checkpointLocation validates where the archive goes: an absolute path of a file
// (not a directory) in an existing directory.
func checkpointLocation(loc string) (string, error) {
	if loc == "" {
		return "", invalid("location is required: the path of the checkpoint archive to write")
	}
	if !filepath.IsAbs(loc) {
		return "", invalid("location %q must be an absolute path", loc)
	}
	if strings.HasSuffix(loc, "/") {
		return "", invalid("location %q must name a file, not a directory", loc)
	}
	loc = filepath.Clean(loc)
	if fi, err := os.Stat(loc); err == nil && fi.IsDir() {
		return "", invalid("location %q is a directory: name the archive file to write", loc)
	}
	dir := filepath.Dir(loc)
	fi, err := os.Stat(dir)
	if err != nil {
		return "", invalid("directory %q of location %q: %v", dir, loc, err)
	}
	if !fi.IsDir() {
		return "", invalid("location %q: %q is not a directory", loc, dir)
	}
	return loc, nil
}

// writeCheckpointMeta writes config.dump, spec.dump, status.dump and crisp's
// container-config.dump into dir.
func writeCheckpointMeta(dir, bundle string, c *container, rec containerRecord, st *runtime.ContainerStatus, at time.Time) error {
	spec, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return fmt.Errorf("read spec: %w", err)
	}
	meta, err := json.Marshal(checkpointMeta{
		ID:              rec.ID,
		Name:            c.config.GetMetadata().GetName(),
		RootfsImage:     rec.ImageID,
		RootfsImageRef:  rec.ImageRef,
		RootfsImageName: userImage(c.config.GetImage()),
		OCIRuntime:      "crisp",
		CreatedTime:     time.Unix(0, rec.CreatedAt).UTC(),
		CheckpointedAt:  at.UTC(),
	})
	if err != nil {
		return fmt.Errorf("encode %s: %w", cpConfigDump, err)
	}
	status, err := protojson.Marshal(st)
	if err != nil {
		return fmt.Errorf("encode %s: %w", cpStatusDump, err)
	}
	for name, data := range map[string][]byte{
		cpConfigDump: meta, cpSpecDump: spec, cpStatusDump: status, cpCRIConfig: rec.Config,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
	}
	return nil
}

// writeRootfsDiff writes rootfs-diff.tar and deleted.files into dir.
func writeRootfsDiff(ctx context.Context, images *image.Service, id, dir string) ([]string, error) {
	f, err := os.OpenFile(filepath.Join(dir, cpRootfsDiff), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, fmt.Errorf("rootfs diff: %w", err)
	}
	defer f.Close()
	deleted, err := images.RootfsDiff(ctx, id, f)
	if err != nil {
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("rootfs diff: %w", err)
	}
	if deleted == nil {
		deleted = []string{}
	}
	data, err := json.Marshal(deleted)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", cpDeletedList, err)
	}
	if err := os.WriteFile(filepath.Join(dir, cpDeletedList), data, 0o600); err != nil {
		return nil, fmt.Errorf("write %s: %w", cpDeletedList, err)
	}
	return deleted, nil
}

// writeArchive tars dir (uncompressed, as CRI-O and containerd write it) into a
// temporary file beside location, syncs it and renames it to location.
func writeArchive(ctx context.Context, dir, location string) (int64, error) {
	tmp, err := os.CreateTemp(filepath.Dir(location), "."+filepath.Base(location)+".tmp-")
	if err != nil {
		return 0, fmt.Errorf("create archive: %w", err)
	}
	done := false
	defer func() {
		if !done {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	rc := archive.Diff(ctx, "", dir)
	n, err := io.Copy(tmp, rc)
	if cerr := rc.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, fmt.Errorf("write archive: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("write archive: %w", err)
	}
	if err := tmp.Chmod(0o600); err != nil {
		return 0, fmt.Errorf("write archive: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		return 0, fmt.Errorf("write archive: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return 0, fmt.Errorf("write archive: %w", err)
	}
	if err := os.Rename(tmp.Name(), location); err != nil {
		return 0, fmt.Errorf("write archive: %w", err)
	}
	done = true
	return n, nil
}

// isCheckpointImage reports whether a container config's image names a checkpoint
// archive rather than an image: an absolute path, which no image reference can be.
func isCheckpointImage(image string) bool { return strings.HasPrefix(image, "/") }

// restoreSource is a checkpoint archive unpacked for CreateContainer.
type restoreSource struct {
	archive string
	dir     string // the unpacked archive, under the state dir
	meta    checkpointMeta
	spec    *specs.Spec
	// orig is the CRI config the container was created with; nil in an archive of
	// another runtime.
	orig *runtime.ContainerConfig
	// image is the original image, found by imageName.
	image     *image.Image
	imageName string
}

// imagesDir is where the CRIU images are; the controller moves them into the bundle.
func (r *restoreSource) imagesDir() string {
	if r == nil {
		return ""
	}
	return filepath.Join(r.dir, cpImagesDir)
}

func (r *restoreSource) close() { _ = os.RemoveAll(r.dir) }

// openCheckpoint unpacks and validates a checkpoint archive (the image a container
// config names, or one container of a pod checkpoint). Garbage and archives that are
// not checkpoints are InvalidArgument; a missing original image is FailedPrecondition
// naming it.
func (s *Service) openCheckpoint(ctx context.Context, path string) (_ *restoreSource, retErr error) {
	path = filepath.Clean(path)
	f, err := os.Open(path)
	if err != nil {
		return nil, invalid("checkpoint archive %q: %v", path, err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, invalid("checkpoint archive %q is not a regular file", path)
	}
	dir, err := os.MkdirTemp(s.cfg.StateDir, "restore-")
	if err != nil {
		return nil, fmt.Errorf("unpack checkpoint archive: %w", err)
	}
	r := &restoreSource{archive: path, dir: dir}
	defer func() {
		if retErr != nil {
			r.close()
		}
	}()
	// Podman and checkpointctl also write gzip and zstd archives.
	ds, err := compression.DecompressStream(f)
	if err != nil {
		return nil, invalid("checkpoint archive %q: %v", path, err)
	}
	defer ds.Close()
	// containerd's applier refuses entries that would leave dir (.., absolute or
	// escaping symlinks, hard links out) and ignores device nodes' owners' tricks.
	if _, err := archive.Apply(ctx, dir, ds, archive.WithNoSameOwner()); err != nil {
		return nil, invalid("checkpoint archive %q is not a valid tar archive: %v", path, err)
	}
	meta := &r.meta
	if err := readJSONFile(filepath.Join(dir, cpConfigDump), meta); err != nil {
		return nil, invalid("%q is not a checkpoint archive: %v", path, err)
	}
	var spec specs.Spec
	if err := readJSONFile(filepath.Join(dir, cpSpecDump), &spec); err != nil {
		return nil, invalid("%q is not a checkpoint archive: %v", path, err)
	}
	if spec.Process == nil || len(spec.Process.Args) == 0 {
		return nil, invalid("checkpoint archive %q: %s has no process", path, cpSpecDump)
	}
	if fi, err := os.Lstat(filepath.Join(dir, cpImagesDir, criuInventory)); err != nil || !fi.Mode().IsRegular() {
		return nil, invalid("%q is not a checkpoint archive: no CRIU images (%s/%s)", path, cpImagesDir, criuInventory)
	}
	r.spec = &spec
	if data, err := os.ReadFile(filepath.Join(dir, cpCRIConfig)); err == nil {
		r.orig = &runtime.ContainerConfig{}
		if err := protojson.Unmarshal(data, r.orig); err != nil {
			return nil, invalid("checkpoint archive %q: decode %s: %v", path, cpCRIConfig, err)
		}
	}

	// The original image: by the name it was created with, else by its digest.
	var names []string
	for _, n := range []string{meta.RootfsImageName, meta.RootfsImageRef, meta.RootfsImage} {
		if n != "" {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return nil, invalid("checkpoint archive %q: %s names no image", path, cpConfigDump)
	}
	for _, n := range names {
		img, err := s.images.Get(n)
		if err == nil {
			r.image, r.imageName = img, n
			break
		}
		if !errdefs.IsNotFound(err) && !errdefs.IsInvalidArgument(err) {
			return nil, err
		}
	}
	if r.image == nil {
		return nil, fmt.Errorf("checkpoint archive %q was made from image %q, which is not present: pull it first: %w",
			path, names[0], errdefs.ErrFailedPrecondition)
	}
	return r, nil
}

// configFor is the config of the container restored from r that req asks for.
func (r *restoreSource) configFor(req *runtime.ContainerConfig) *runtime.ContainerConfig {
	return restoredConfig(req, r.orig, r.spec, r.imageName)
}

// restoredConfig is the config of a container restored from a checkpoint: what the
// process was created with (it is restored, not started: command, environment, user,
// security context and tty must match the dump) from the archive, what belongs to the
// new container from the request: metadata, labels, annotations, log path and, when
// given, mounts, devices and resources.
func restoredConfig(req, orig *runtime.ContainerConfig, spec *specs.Spec, imageName string) *runtime.ContainerConfig {
	var cfg *runtime.ContainerConfig
	if orig != nil {
		cfg = proto.Clone(orig).(*runtime.ContainerConfig)
	} else {
		// An archive of another runtime: the process comes from its OCI spec, the
		// rest from the request.
		cfg = proto.Clone(req).(*runtime.ContainerConfig)
		cfg.Command, cfg.Args, cfg.WorkingDir, cfg.Envs = spec.Process.Args, nil, spec.Process.Cwd, nil
		for _, kv := range spec.Process.Env {
			k, v, _ := strings.Cut(kv, "=")
			cfg.Envs = append(cfg.Envs, &runtime.KeyValue{Key: k, Value: []byte(v)})
		}
		cfg.Tty = spec.Process.Terminal
	}
	cfg.Metadata = req.GetMetadata()
	cfg.Labels, cfg.Annotations, cfg.LogPath = req.GetLabels(), req.GetAnnotations(), req.GetLogPath()
	cfg.Image = &runtime.ImageSpec{Image: imageName, UserSpecifiedImage: imageName}
	if len(req.GetMounts()) > 0 {
		cfg.Mounts = req.GetMounts()
	}
	if len(req.GetDevices()) > 0 {
		cfg.Devices = req.GetDevices()
	}
	if res := req.GetLinux().GetResources(); res != nil {
		if cfg.Linux == nil {
			cfg.Linux = &runtime.LinuxContainerConfig{}
		}
		cfg.Linux.Resources = res
	}
	return cfg
}

// applyRootfs puts the archive's rootfs changes into the new container's snapshot.
func (r *restoreSource) applyRootfs(ctx context.Context, images *image.Service, id string) error {
	var deleted []string
	if err := readJSONFile(filepath.Join(r.dir, cpDeletedList), &deleted); err != nil && !errors.Is(err, os.ErrNotExist) {
		return invalid("checkpoint archive %q: %v", r.archive, err)
	}
	var diff io.Reader
	f, err := os.Open(filepath.Join(r.dir, cpRootfsDiff))
	switch {
	case err == nil:
		defer f.Close()
		diff = f
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("checkpoint archive %q: %w", r.archive, err)
	}
	if err := images.ApplyRootfsDiff(ctx, id, diff, deleted); err != nil {
		return fmt.Errorf("restore the rootfs changes of checkpoint archive %q: %v: %w", r.archive, err, errdefs.ErrInvalidArgument)
	}
	return nil
}

// readJSONFile decodes a file of an unpacked archive; only regular files are read.
func readJSONFile(path string, v any) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", filepath.Base(path))
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("decode %s: %w", filepath.Base(path), err)
	}
	return nil
}
