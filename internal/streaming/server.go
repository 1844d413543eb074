package streaming

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
	"strconv"
	"sync"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-streaming/pkg/streaming/portforward"
	"k8s.io/cri-streaming/pkg/streaming/remotecommand"
	"k8s.io/streaming/pkg/httpstream/wsstream"
)

// Runtime runs what the streams are connected to. Streams the client did not ask for
// are nil.
type Runtime interface {
	Exec(ctx context.Context, containerID string, cmd []string, in io.Reader, out, err io.WriteCloser, tty bool, resize <-chan TerminalSize) error
	Attach(ctx context.Context, containerID string, in io.Reader, out, err io.WriteCloser, tty bool, resize <-chan TerminalSize) error
	PortForward(ctx context.Context, podSandboxID string, port int32, stream io.ReadWriteCloser) error
}

// TerminalSize is one resize event of a tty session.
type TerminalSize = remotecommand.TerminalSize

// Config says where and how the server listens.
type Config struct {
	// Address and Port to listen on; Port 0 picks a free port.
	Address string
	Port    int
	// TLSCertFile and TLSKeyFile, when both set, make the server serve HTTPS.
	TLSCertFile, TLSKeyFile string
	// IdleTimeout closes a connection that carried no traffic for this long.
	IdleTimeout time.Duration
	// TokenTTL is how long a URL stays valid before its first use; 1 minute when 0,
	// kubelet's value.
	TokenTTL time.Duration
	// MaxPending bounds the URLs handed out but not yet used; 1000 when 0.
	MaxPending int
}

// streamCreationTimeout bounds how long a SPDY client may take to open its streams.
const streamCreationTimeout = 30 * time.Second

// Server is a listening streaming server.
//
// k8s.io/cri-streaming supplies the SPDY exec/attach protocol and both port-forward
// protocols; the token cache and the websocket exec/attach protocols are our own.
// That library's websocket side stops at v4, so a websocket client could not close
// stdin (the v5 CLOSE frame), and it hands the runtime a reader for stdin even when the
// client did not ask for one, which reads EOF at once and hangs up a terminal.
type Server struct {
	cfg    Config
	rt     Runtime
	tokens *tokenCache
	http   *http.Server
	lis    net.Listener
	log    *slog.Logger
	base   *url.URL

	wg sync.WaitGroup
}

// New listens on the configured address and prepares the server; Start serves.
// Listening here rather than in Start fixes the URL's port (when Port is 0) before
// any CRI call can ask for a URL.
func New(cfg Config, rt Runtime, log *slog.Logger) (*Server, error) {
	if cfg.TokenTTL <= 0 {
		cfg.TokenTTL = time.Minute
	}
	if cfg.MaxPending <= 0 {
		cfg.MaxPending = 1000
	}
	var tlsCfg *tls.Config
	if cfg.TLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(cfg.TLSCertFile, cfg.TLSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("load streaming TLS key pair: %w", err)
		}
		tlsCfg = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	lis, err := net.Listen("tcp", net.JoinHostPort(cfg.Address, strconv.Itoa(cfg.Port)))
	if err != nil {
		return nil, fmt.Errorf("listen for streaming: %w", err)
	}
	base := &url.URL{Scheme: "http", Host: lis.Addr().String()}
	if tlsCfg != nil {
		base.Scheme = "https"
	}
	s := &Server{
		cfg:    cfg,
		rt:     rt,
		tokens: newTokenCache(cfg.TokenTTL, cfg.MaxPending),
		lis:    lis,
		log:    log,
		base:   base,
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/exec/{token}", s.serveExec)
	mux.HandleFunc("/attach/{token}", s.serveAttach)
	mux.HandleFunc("/portforward/{token}", s.servePortForward)
	// ReadHeaderTimeout bounds slow clients before the upgrade; the stream's idle
	// timeout applies after it.
	watched := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w, r, cancel := watchHijack(w, r)
		defer cancel()
		mux.ServeHTTP(w, r)
	})
	s.http = &http.Server{Handler: watched, TLSConfig: tlsCfg, ReadHeaderTimeout: 30 * time.Second}
	return s, nil
}

// URL is the server's base URL.
func (s *Server) URL() string { return s.base.String() }

// Start serves in the background until Stop.
func (s *Server) Start() {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		var err error
		if s.http.TLSConfig != nil {
			err = s.http.ServeTLS(s.lis, "", "")
		} else {
			err = s.http.Serve(s.lis)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("streaming server stopped", "err", err)
		}
	}()
	s.log.Info("streaming server serving", "url", s.URL())
}

// Stop closes the listener so no new session starts. Hijacked SPDY and websocket
// connections are not tracked by http.Server: sessions already running end with
// their client or with criserver's exit.
func (s *Server) Stop(ctx context.Context) error {
	err := s.http.Shutdown(ctx)
	if err != nil {
		err = s.http.Close()
	}
	s.wg.Wait()
	if err != nil {
		return fmt.Errorf("stop streaming server: %w", err)
	}
	return nil
}

// GetExec returns a single-use URL for an exec request the caller has validated.
func (s *Server) GetExec(req *runtimeapi.ExecRequest) (*runtimeapi.ExecResponse, error) {
	u, err := s.urlFor("exec", req)
	if err != nil {
		return nil, err
	}
	return &runtimeapi.ExecResponse{Url: u}, nil
}

// GetAttach returns a single-use URL for an attach request the caller has validated.
func (s *Server) GetAttach(req *runtimeapi.AttachRequest) (*runtimeapi.AttachResponse, error) {
	u, err := s.urlFor("attach", req)
	if err != nil {
		return nil, err
	}
	return &runtimeapi.AttachResponse{Url: u}, nil
}

// GetPortForward returns a single-use URL for a port-forward request.
func (s *Server) GetPortForward(req *runtimeapi.PortForwardRequest) (*runtimeapi.PortForwardResponse, error) {
	u, err := s.urlFor("portforward", req)
	if err != nil {
		return nil, err
	}
	return &runtimeapi.PortForwardResponse{Url: u}, nil
}

func (s *Server) urlFor(kind string, req any) (string, error) {
	token, err := s.tokens.insert(req)
	if err != nil {
		return "", err
	}
	return s.base.JoinPath(kind, token).String(), nil
}

// consume resolves the request's token to a request of type T; it answers 404 itself.
func consume[T any](s *Server, w http.ResponseWriter, r *http.Request) (T, bool) {
	var zero T
	if r.Method != http.MethodGet && r.Method != http.MethodPost {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return zero, false
	}
	v, ok := s.tokens.consume(r.PathValue("token"))
	if !ok {
		http.NotFound(w, r)
		return zero, false
	}
	req, ok := v.(T)
	if !ok {
		// A token of another kind: an exec token on the attach path.
		http.NotFound(w, r)
		return zero, false
	}
	return req, true
}

func (s *Server) serveExec(w http.ResponseWriter, r *http.Request) {
	req, ok := consume[*runtimeapi.ExecRequest](s, w, r)
	if !ok {
		return
	}
	opts := &remotecommand.Options{Stdin: req.Stdin, Stdout: req.Stdout, Stderr: req.Stderr, TTY: req.Tty}
	run := func(ctx context.Context, in io.Reader, out, errw io.WriteCloser, resize <-chan TerminalSize) error {
		return s.rt.Exec(ctx, req.ContainerId, req.Cmd, in, out, errw, req.Tty, resize)
	}
	if wsstream.IsWebSocketRequest(r) {
		s.serveWebSocket(w, r, opts, run)
		return
	}
	remotecommand.ServeExec(w, r, spdyAdapter(run), "", "", req.ContainerId, req.Cmd, opts,
		s.cfg.IdleTimeout, streamCreationTimeout, remotecommand.SupportedStreamingProtocols)
}

func (s *Server) serveAttach(w http.ResponseWriter, r *http.Request) {
	req, ok := consume[*runtimeapi.AttachRequest](s, w, r)
	if !ok {
		return
	}
	opts := &remotecommand.Options{Stdin: req.Stdin, Stdout: req.Stdout, Stderr: req.Stderr, TTY: req.Tty}
	run := func(ctx context.Context, in io.Reader, out, errw io.WriteCloser, resize <-chan TerminalSize) error {
		return s.rt.Attach(ctx, req.ContainerId, in, out, errw, req.Tty, resize)
	}
	if wsstream.IsWebSocketRequest(r) {
		s.serveWebSocket(w, r, opts, run)
		return
	}
	remotecommand.ServeAttach(w, r, spdyAdapter(run), "", "", req.ContainerId, opts,
		s.cfg.IdleTimeout, streamCreationTimeout, remotecommand.SupportedStreamingProtocols)
}

func (s *Server) servePortForward(w http.ResponseWriter, r *http.Request) {
	req, ok := consume[*runtimeapi.PortForwardRequest](s, w, r)
	if !ok {
		return
	}
	opts, err := portforward.BuildV4Options(req.Port)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	portforward.ServePortForward(w, r, pfAdapter{s.rt}, req.PodSandboxId, "", opts,
		s.cfg.IdleTimeout, streamCreationTimeout, portforward.SupportedProtocols)
}

// session runs one exec or attach with the streams of a connection.
type session func(ctx context.Context, in io.Reader, out, errw io.WriteCloser, resize <-chan TerminalSize) error

// spdyAdapter gives a session the library's Executor and Attacher interfaces.
type spdyAdapter session

func (f spdyAdapter) ExecInContainer(ctx context.Context, _, _, _ string, _ []string, in io.Reader, out, errw io.WriteCloser, _ bool, resize <-chan TerminalSize, _ time.Duration) error {
	return f(ctx, in, out, errw, resize)
}

func (f spdyAdapter) AttachContainer(ctx context.Context, _, _, _ string, in io.Reader, out, errw io.WriteCloser, _ bool, resize <-chan TerminalSize) error {
	return f(ctx, in, out, errw, resize)
}

// pfAdapter gives the Runtime the library's PortForwarder interface.
type pfAdapter struct{ rt Runtime }

func (a pfAdapter) PortForward(ctx context.Context, podSandboxID, _ string, port int32, stream io.ReadWriteCloser) error {
	return a.rt.PortForward(ctx, podSandboxID, port, stream)
}
