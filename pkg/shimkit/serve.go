package shimkit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/ttrpc"
	"golang.org/x/sys/unix"

	sandboxapi "github.com/crisp-runtime/crisp/api/containerd/sandbox/v1"
	"github.com/crisp-runtime/crisp/internal/podfiles"
	"github.com/crisp-runtime/crisp/internal/tracing/recorder"
	"github.com/crisp-runtime/crisp/pkg/shimkit/bootstrap"
	"github.com/crisp-runtime/crisp/pkg/shimkit/events"
	"github.com/crisp-runtime/crisp/pkg/shimkit/reaper"
	"github.com/crisp-runtime/crisp/pkg/shimkit/task"
)

// shutdownTimeout bounds how long the shim waits for replies in flight before exiting.
const shutdownTimeout = 5 * time.Second

// signalShutdownTimeout bounds the cleanup SIGTERM triggers (deleting the containers,
// stopping the sandbox and removing what it holds).
const signalShutdownTimeout = 30 * time.Second

// eventsFlushTimeout bounds how long an exiting shim keeps trying to send the task
// events still queued (the last /tasks/exit and /tasks/delete of the pod).
const eventsFlushTimeout = 2 * time.Second

// hangupGrace is how long the shim waits, after replying to ShutdownSandbox, for clients
// to close their connections before it closes them.
const hangupGrace = 100 * time.Millisecond

// Sandbox is a sandboxer's containerd.runtime.sandbox.v1 service, served on the shim's
// socket next to the kit's task service.
type Sandbox interface {
	sandboxapi.TTRPCSandboxService
	// Created reports whether CreateSandbox has run. A shim without a sandbox is a
	// plain task shim (containerd's podsandbox, task-only callers): it exits on a task
	// Shutdown that finds no container left.
	Created() bool
	// Pid is the sandbox's process once StartSandbox has started it (its namespaces
	// are the pod's): a task Connect on the sandbox's id answers with it, as containerd
	// 2.x reconnects to a sandbox shim after its own restart.
	Pid() (int, bool)
	// Shutdown stops the sandbox and removes what it holds, when a signal ends the
	// shim (SIGTERM, SIGINT); the kit has deleted the containers before.
	Shutdown(ctx context.Context) error
}

// Env is what the kit made for a serving shim's services.
type Env struct {
	// ID is the shim's -id, Namespace its namespace, Bundle its bundle directory.
	ID, Namespace, Bundle string
	Log                   *slog.Logger
	// Reaper is the shim's child subreaper: a runner runs its helpers and a sandbox
	// its processes through it.
	Reaper *reaper.Reaper
	// RemoveSocket removes the shim's socket; a Sandbox's ShutdownSandbox calls it
	// before it replies, so that nobody connects to a shim that is going.
	RemoveSocket func()
	// Exit ends the shim once the reply in flight has been handed to the transport; a
	// Sandbox's ShutdownSandbox calls it after cleaning up. It does not block.
	Exit func()
}

// Services are a serving shim's parts, made by the sandboxer from the kit's Env.
type Services struct {
	// Sandbox is the pod's sandbox service; nil serves the task API alone.
	Sandbox Sandbox
	// Runner runs the containers for the kit's task service.
	Runner task.Runner
	// PodFiles, when set, are the pod's /etc files and /dev/shm the sandbox made for
	// containerd's shim sandboxer (task.Config.PodFiles).
	PodFiles func() (podfiles.Paths, bool)
}

// Serve runs a shim's ttrpc server on the socket `start` handed over (bootstrap.Listener)
// until ShutdownSandbox, an idle task Shutdown of a shim without a sandbox, or
// SIGTERM/SIGINT: the sandbox service build returns, the kit's task service over its
// runner, crisp.shim.v1.Shim, task events to the caller's event service, spans of
// traced calls to crisp's relay, and errdefs kinds turned into gRPC codes.
func Serve(ctx context.Context, f bootstrap.Flags, log *slog.Logger, build func(Env) (*Services, error)) error {
	if f.ID == "" {
		return errors.New("serve: -id is required")
	}
	bundle, err := bootstrap.BundleDir(f.Bundle)
	if err != nil {
		return err
	}
	l, err := bootstrap.Listener()
	if err != nil {
		return err
	}
	socketPath := l.Addr().String()
	log = log.With("id", f.ID, "namespace", f.Namespace)

	if err := reaper.SetSubreaper(); err != nil {
		_ = l.Close()
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r := reaper.New(log)
	go r.Run(ctx)

	// Registered before serving so that a SIGTERM arriving early still shuts down
	// cleanly instead of killing the shim with the pause process left running.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, unix.SIGTERM, unix.SIGINT)
	defer signal.Stop(sigs)

	removeSocket := func() {
		if err := os.Remove(socketPath); err != nil && !errors.Is(err, os.ErrNotExist) {
			log.Warn("remove socket", "path", socketPath, "error", err)
		}
	}
	exit := make(chan struct{})
	var exitOnce sync.Once
	exitNow := func() { exitOnce.Do(func() { close(exit) }) }
	services, err := build(Env{ID: f.ID, Namespace: f.Namespace, Bundle: bundle, Log: log, Reaper: r,
		RemoveSocket: removeSocket, Exit: exitNow})
	if err != nil {
		_ = l.Close()
		return err
	}
	svc := services.Sandbox
	// Task events go to the caller's ttrpc Events service: containerd's TTRPC_ADDRESS
	// (from BootstrapParams or its environment, see childEnv). crisp's controller
	// gives none and learns of exits through Wait.
	pub := events.Start(events.Config{Address: os.Getenv("TTRPC_ADDRESS"), Namespace: f.Namespace, Logger: log})
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), eventsFlushTimeout)
		defer cancel()
		if err := pub.Close(ctx); err != nil {
			log.Warn("task events", "error", err)
		}
	}()
	// Spans of traced calls go to criserver's relay (its sender starts with the first
	// traced call); the last ones are sent once the server has stopped (defers run last
	// first).
	rec := recorder.New(f.ID, os.Getpid(), log)
	defer func() {
		fctx, fcancel := context.WithTimeout(context.Background(), eventsFlushTimeout)
		defer fcancel()
		rec.Close(fctx)
	}()
	tcfg := task.Config{
		SandboxID: f.ID,
		PodFiles:  services.PodFiles,
		Runner:    services.Runner,
		Logger:    log,
		Reaper:    r,
		Events:    pub,
		OnIdleShutdown: func() {
			if svc == nil || !svc.Created() {
				log.Info("task Shutdown with no task left and no sandbox: exiting")
				removeSocket()
				exitNow()
			}
		},
	}
	if svc != nil {
		tcfg.SandboxPid = svc.Pid
	}
	tasks, err := task.New(tcfg)
	if err != nil {
		_ = l.Close()
		return err
	}
	// The services return errdefs kinds; they become gRPC codes here, once.
	server, err := ttrpc.NewServer(ttrpc.WithChainUnaryServerInterceptor(rec.ServerInterceptor(),
		func(ctx context.Context, um ttrpc.Unmarshaler, _ *ttrpc.UnaryServerInfo, m ttrpc.Method) (any, error) {
			resp, err := m(ctx, um)
			return resp, task.GRPCStatus(err)
		}))
	if err != nil {
		_ = l.Close()
		return fmt.Errorf("ttrpc server: %w", err)
	}
	if svc != nil {
		sandboxapi.RegisterTTRPCSandboxService(server, &podSandbox{Sandbox: svc, id: f.ID, tasks: tasks, log: log})
	}
	task.Register(server, tasks)

	tl := &trackingListener{Listener: l}
	served := make(chan error, 1)
	go func() { served <- server.Serve(ctx, tl) }()
	log.Info("shim serving", "socket", socketPath, "pid", os.Getpid(), "bundle", bundle)

	select {
	case <-exit:
		log.Info("shutdown requested")
		// A ttrpc client that sees the connection close right behind a reply may report
		// ErrClosed instead of the reply (its dispatcher selects on both), so give
		// clients a moment to read the reply and hang up first.
		hctx, hcancel := context.WithTimeout(ctx, hangupGrace)
		tl.wait(hctx)
		hcancel()
	case sig := <-sigs:
		log.Info("signal received, shutting down", "signal", sig.String())
		sctx, scancel := context.WithTimeout(ctx, signalShutdownTimeout)
		if err := tasks.DeleteAll(sctx); err != nil {
			log.Error("delete containers", "error", err)
		}
		if svc != nil {
			if err := svc.Shutdown(sctx); err != nil {
				log.Error("shutdown", "error", err)
			}
		}
		scancel()
		removeSocket()
	case err := <-served:
		if err != nil && !errors.Is(err, ttrpc.ErrServerClosed) {
			return fmt.Errorf("ttrpc serve: %w", err)
		}
		return nil
	}

	// Stop accepting; idle connections are closed, busy ones first finish their request.
	sctx, scancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer scancel()
	if err := server.Shutdown(sctx); err != nil {
		log.Warn("ttrpc shutdown incomplete, closing", "error", err)
		_ = server.Close()
	}
	// ttrpc's Shutdown returns as soon as it has told idle connections to close, not
	// when they have finished writing; the last reply would be lost if the process
	// exited now.
	if !tl.wait(sctx) {
		log.Warn("connections still open at exit")
	}
	log.Info("shim exiting")
	return nil
}

// podSandbox is the sandboxer's sandbox service whose ShutdownSandbox first deletes
// the pod's containers (processes, cgroups, rootfs mounts): they must not outlive the
// shim that tracks them.
type podSandbox struct {
	Sandbox
	id    string
	tasks *task.Service
	log   *slog.Logger
}

func (p *podSandbox) ShutdownSandbox(ctx context.Context, req *sandboxapi.ShutdownSandboxRequest) (*sandboxapi.ShutdownSandboxResponse, error) {
	var delErr error
	if req.GetSandboxID() == p.id {
		if delErr = p.tasks.DeleteAll(ctx); delErr != nil {
			p.log.Error("delete containers before shutdown", "error", delErr)
		}
	}
	resp, err := p.Sandbox.ShutdownSandbox(ctx, req)
	if err == nil && delErr != nil {
		// The shim exits all the same; the error tells the caller what is left.
		return nil, fmt.Errorf("shutdown sandbox %s: %w", p.id, delErr)
	}
	return resp, err
}

// trackingListener counts the connections it accepted until they are closed.
type trackingListener struct {
	net.Listener
	open atomic.Int64
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.open.Add(1)
	return &trackedConn{Conn: c, closed: func() { l.open.Add(-1) }}, nil
}

// wait reports whether every accepted connection was closed before ctx ended. It polls:
// connections may still be accepted meanwhile, which a WaitGroup would not allow.
func (l *trackingListener) wait(ctx context.Context) bool {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for l.open.Load() > 0 {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
	return true
}

type trackedConn struct {
	net.Conn
	once   sync.Once
	closed func()
}

func (c *trackedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.closed)
	return err
}
