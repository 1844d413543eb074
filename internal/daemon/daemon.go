package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"

	"github.com/crisp-runtime/crisp/controller"
	"github.com/crisp-runtime/crisp/internal/config"
	"github.com/crisp-runtime/crisp/internal/cri"
	"github.com/crisp-runtime/crisp/internal/daemon/memtrim"
	"github.com/crisp-runtime/crisp/internal/image"
	"github.com/crisp-runtime/crisp/internal/metrics"
	"github.com/crisp-runtime/crisp/internal/network"
	"github.com/crisp-runtime/crisp/internal/nri"
	"github.com/crisp-runtime/crisp/internal/store"
	"github.com/crisp-runtime/crisp/internal/streaming"
	"github.com/crisp-runtime/crisp/internal/tracing/export"
	"github.com/crisp-runtime/crisp/internal/version"
)

// maxMsgSize matches kubelet's 16 MiB limit on CRI messages.
const maxMsgSize = 16 << 20

// NewLogger returns criserver's structured logger at the configured level, and the
// level it filters at, which a reload of the config sets.
func NewLogger(level string) (*slog.Logger, *slog.LevelVar) {
	lv := new(slog.LevelVar)
	lv.Set(parseLevel(level))
	return slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: lv})), lv
}

// Options are what Run needs besides the config.
type Options struct {
	// ConfigPath is the file the config was loaded from, read again on each reload
	// request; empty when criserver runs on the defaults.
	ConfigPath string
	// Log is criserver's logger and Level the level its handler filters at, as
	// NewLogger returns them; a reload sets Level.
	Log   *slog.Logger
	Level *slog.LevelVar
	// Reload delivers reload requests (SIGHUP). The caller subscribes it before it
	// does anything slow, since SIGHUP's default action ends the process; requests
	// that arrive before Run is ready wait in it. Nil: no reloads.
	Reload <-chan os.Signal
}

// Run serves the CRI until ctx is cancelled; pods keep running after it returns.
func Run(ctx context.Context, cfg config.Config, opts Options) error {
	log := opts.Log
	if log == nil {
		log = slog.Default()
	}
	log.Info("criserver starting", "version", version.Version, "config", opts.ConfigPath)
	// Built first: a registry setting that cannot work fails the start before any
	// state is touched.
	rc, err := remoteConfig(cfg)
	if err != nil {
		return err
	}
	for _, dir := range []string{cfg.RootDir, cfg.StateDir, filepath.Dir(cfg.Socket)} {
		if err := os.MkdirAll(dir, 0o711); err != nil {
			return fmt.Errorf("create %s: %w", dir, err)
		}
	}
	// Fail fast, before waiting on the database lock, when another criserver serves.
	if err := socketFree(cfg.Socket); err != nil {
		return err
	}
	st, err := store.Open(filepath.Join(cfg.RootDir, "meta.db"))
	if err != nil {
		return err
	}
	defer st.Close()

	// Metrics are off (nil, recording nothing) unless an address is configured. The
	// listener opens first so that an address in use fails the start at once.
	var m *metrics.Metrics
	if cfg.Metrics.Address != "" {
		m = metrics.New()
		m.ConfigLoaded()
		stop, err := serveMetrics(cfg.Metrics.Address, m, log)
		if err != nil {
			return err
		}
		defer stop()
	}

	netMgr, err := network.New(network.Config{
		ConfDir:       cfg.CNI.ConfDir,
		BinDirs:       cfg.CNI.BinDirs,
		CacheDir:      filepath.Join(cfg.RootDir, "cni", "cache"),
		DefaultBridge: cfg.CNI.DefaultBridge,
		DefaultSubnet: cfg.CNI.DefaultSubnet,
		IPAMDataDir:   filepath.Join(cfg.RootDir, "cni", "networks"),
		Timeout:       time.Duration(cfg.CNI.TimeoutSeconds) * time.Second,
		Masquerade:    network.Masquerade(cfg.CNI.Masquerade),
	}, log.With("component", "network"))
	if err != nil {
		return fmt.Errorf("set up pod network: %w", err)
	}
	defer netMgr.Close()
	netMgr.SetMetrics(m)

	// Tracing starts before anything that makes spans; it flushes last (defers run
	// last first), after the CRI server and the shim connections are gone.
	tr, err := export.New(ctx, cfg.Tracing, filepath.Join(cfg.StateDir, "trace-relay.sock"), log.With("component", "tracing"))
	if err != nil {
		return err
	}
	defer func() {
		fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tr.Close(fctx); err != nil {
			log.Warn("tracing: flush spans", "err", err)
		}
	}()

	ctrl, err := controller.New(controller.Options{
		StateDir:         cfg.StateDir,
		Runtimes:         cfg.Runtimes,
		ShimStartTimeout: time.Duration(cfg.ShimStartTimeoutSeconds) * time.Second,
		SystemdCgroup:    cfg.CgroupDriver == config.CgroupDriverSystemd,
		Address:          cfg.Socket,
		Metrics:          m,
		ShimInterceptor:  tr.TTRPCClientInterceptor(),
		TaskShimEnv:      tr.TaskShimEnv(),
	}, st, netMgr, log.With("component", "controller"))
	if err != nil {
		return err
	}
	defer ctrl.Close()
	live, err := ctrl.Recover(ctx)
	if err != nil {
		return err
	}
	images, err := image.New(image.Config{
		Root:           filepath.Join(cfg.RootDir, "images"),
		Remote:         rc,
		Pinned:         cfg.Image.Pinned,
		MinFreeBytes:   cfg.Image.MinFreeBytes,
		MinFreePercent: cfg.Image.MinFreePercent,
		Metrics:        m,
	}, st, log.With("component", "image"))
	if err != nil {
		return fmt.Errorf("open image store: %w", err)
	}
	// Reloads are served from here on (what they change exists now), while the rest
	// of the start goes on; a request that came earlier has waited in opts.Reload.
	if opts.Reload != nil {
		r := &reloader{path: opts.ConfigPath, level: opts.Level, images: images, metrics: m,
			log: log.With("component", "reload"), running: cfg}
		defer r.start(opts.Reload)()
	}
	svc := cri.New(cfg, st, ctrl, netMgr, images, log.With("component", "cri"))
	// Before ctrl.Close (defers run last first): exit monitors must be gone before the
	// shim connections they wait on are closed.
	defer svc.Close()
	svc.SetMetrics(m)
	if err := svc.Recover(ctx, live); err != nil {
		return err
	}
	// NRI starts once the recovered pods and containers are known (a plugin that
	// connects is synchronized with them) and before the CRI socket serves; it stops
	// after the CRI server (defers run last first), so no call is left half-relayed.
	n, err := nri.New(cfg.NRI, log.With("component", "nri"), svc.CDIInjector())
	if err != nil {
		return err
	}
	svc.SetNRI(n)
	if err := n.Start(svc.NRIRuntime()); err != nil {
		return err
	}
	defer n.Stop()
	go svc.WatchSandboxExits(ctx)

	// Image pulls and pod bursts leave megabytes of free heap that the runtime's
	// scavenger would hand back only over minutes; a node's daemon should not sit on
	// its peak.
	go memtrim.Run(ctx, 10*time.Second, 2<<20)

	// The streaming libraries log through klog; send that into our structured log
	// instead of bare lines on stderr.
	klog.SetSlogLogger(log.With("component", "streaming"))
	// The streaming server starts before the CRI socket, so no Exec can be answered
	// before there is a server behind its URL.
	stream, err := streaming.New(streaming.Config{
		Address:     cfg.Streaming.Address,
		Port:        cfg.Streaming.Port,
		TLSCertFile: cfg.Streaming.TLSCertFile,
		TLSKeyFile:  cfg.Streaming.TLSKeyFile,
		IdleTimeout: time.Duration(cfg.Streaming.IdleTimeoutSeconds) * time.Second,
	}, svc.StreamRuntime(), log.With("component", "streaming"))
	if err != nil {
		return err
	}
	svc.SetStreamServer(stream)
	stream.Start()
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := stream.Stop(sctx); err != nil {
			log.Warn("stop streaming server", "err", err)
		}
	}()

	lis, err := listen(cfg.Socket)
	if err != nil {
		return err
	}
	unary := []grpc.UnaryServerInterceptor{logErrors(log)}
	var streams []grpc.StreamServerInterceptor
	if m != nil {
		// Outermost, so the latency counts the logging too, as the client sees it.
		unary = append([]grpc.UnaryServerInterceptor{m.UnaryServerInterceptor()}, unary...)
		streams = append(streams, m.StreamServerInterceptor())
	}
	sopts := append([]grpc.ServerOption{grpc.MaxRecvMsgSize(maxMsgSize), grpc.MaxSendMsgSize(maxMsgSize),
		grpc.ChainUnaryInterceptor(unary...), grpc.ChainStreamInterceptor(streams...)}, tr.GRPCServerOptions()...)
	srv := grpc.NewServer(sopts...)
	runtime.RegisterRuntimeServiceServer(srv, svc)
	runtime.RegisterImageServiceServer(srv, svc)

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	log.Info("criserver serving", "socket", cfg.Socket, "version", version.Version, "root", cfg.RootDir, "state", cfg.StateDir)
	select {
	case err := <-errc:
		return fmt.Errorf("serve CRI: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down; pods keep running")
	// Event streams never end on their own: end them so GracefulStop need not wait.
	svc.CloseEvents()
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		srv.Stop()
	}
	_ = os.Remove(cfg.Socket)
	return nil
}

// serveMetrics serves m's /metrics on addr (and nothing else) until stop is called.
func serveMetrics(addr string, m *metrics.Metrics, log *slog.Logger) (stop func(), err error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen for metrics on %s: %w", addr, err)
	}
	srv := &http.Server{
		Handler: m.Handler(),
		// Bounds a client that opens a connection and never finishes its request.
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server stopped", "address", lis.Addr().String(), "err", err)
		}
	}()
	log.Info("serving metrics", "address", lis.Addr().String(), "path", metrics.Path)
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			log.Warn("stop metrics server", "err", err)
		}
		<-done
	}, nil
}

// listen opens the CRI socket, replacing a stale file but refusing to steal the
// socket of a criserver that is still running.
func listen(path string) (net.Listener, error) {
	if err := socketFree(path); err != nil {
		return nil, err
	}
	if _, err := os.Stat(path); err == nil {
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove stale socket %s: %w", path, err)
		}
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o660); err != nil {
		_ = lis.Close()
		return nil, fmt.Errorf("chmod %s: %w", path, err)
	}
	return lis, nil
}

// socketBusyFor is how long the socket must keep taking connections before criserver
// believes another one serves it. A criserver killed with SIGKILL can leave children
// it had forked but not yet exec'd (CNI plugins, shims), which hold its listening
// socket, close-on-exec, for a few milliseconds more: a connect then succeeds although
// nobody will ever answer.
const socketBusyFor = time.Second

// socketFree fails when something keeps taking connections on the socket at path.
func socketFree(path string) error {
	deadline := time.Now().Add(socketBusyFor)
	for {
		c, err := net.DialTimeout("unix", path, time.Second)
		if err != nil {
			return nil
		}
		_ = c.Close()
		if time.Now().After(deadline) {
			return fmt.Errorf("socket %s is in use: is another criserver running?", path)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// logErrors logs every failed CRI call once, with its method and code.
func logErrors(log *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
		if err != nil {
			log.Warn("CRI call failed", "method", info.FullMethod, "err", err, "duration", time.Since(start))
		} else if log.Enabled(ctx, slog.LevelDebug) {
			log.Debug("CRI call", "method", info.FullMethod, "duration", time.Since(start))
		}
		return resp, err
	}
}
