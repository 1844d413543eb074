package streaming

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"k8s.io/cri-streaming/pkg/streaming/remotecommand"
	"k8s.io/streaming/pkg/httpstream/wsstream"
)

// The channels of the websocket remotecommand protocols, in wire order.
const (
	chanStdin = iota
	chanStdout
	chanStderr
	chanError
	chanResize
)

// The websocket subprotocols served. v5 adds the CLOSE frame with which a client ends
// its stdin (wsstream handles it for that protocol name); v4 added structured exit
// statuses; the older ones report only an error message.
const (
	protoV5       = remotecommand.StreamProtocolV5Name
	protoV4       = "v4." + wsstream.ChannelWebSocketProtocol
	protoV4Base64 = "v4." + wsstream.Base64ChannelWebSocketProtocol
)

// exitCoder is an error carrying a process's exit status (k8s.io/utils/exec.ExitError).
type exitCoder interface {
	error
	Exited() bool
	ExitStatus() int
}

// serveWebSocket upgrades the request to a channel websocket and runs the session.
func (s *Server) serveWebSocket(w http.ResponseWriter, r *http.Request, opts *remotecommand.Options, run session) {
	channels := []wsstream.ChannelType{
		chanStdin:  channelType(opts.Stdin, wsstream.ReadChannel),
		chanStdout: channelType(opts.Stdout, wsstream.WriteChannel),
		chanStderr: channelType(opts.Stderr, wsstream.WriteChannel),
		chanError:  wsstream.WriteChannel,
		chanResize: wsstream.ReadChannel,
	}
	binary := wsstream.ChannelProtocolConfig{Binary: true, Channels: channels}
	b64 := wsstream.ChannelProtocolConfig{Binary: false, Channels: channels}
	conn := wsstream.NewConn(map[string]wsstream.ChannelProtocolConfig{
		protoV5:                                 binary,
		protoV4:                                 binary,
		protoV4Base64:                           b64,
		wsstream.ChannelWebSocketProtocol:       binary,
		wsstream.Base64ChannelWebSocketProtocol: b64,
		"":                                      binary,
	})
	conn.SetIdleTimeout(s.cfg.IdleTimeout)
	proto, streams, err := conn.Open(w, r)
	if err != nil {
		s.log.Debug("websocket upgrade", "err", err)
		return
	}
	defer conn.Close()

	// An empty frame on the first output channel tells the client the session is up.
	switch {
	case opts.Stdout:
		_, _ = streams[chanStdout].Write(nil)
	case opts.Stderr:
		_, _ = streams[chanStderr].Write(nil)
	default:
		_, _ = streams[chanError].Write(nil)
	}

	// Streams the client did not ask for stay nil: an ignored stdin channel reads EOF
	// at once, and for a terminal that EOF would hang the session up.
	var in io.Reader
	var out, errw io.WriteCloser
	if opts.Stdin {
		in = streams[chanStdin]
	}
	if opts.Stdout {
		out = streams[chanStdout]
	}
	if opts.Stderr {
		errw = streams[chanStderr]
	}
	var resize chan TerminalSize
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	if opts.TTY {
		resize = make(chan TerminalSize)
		go decodeResizes(ctx, streams[chanResize], resize)
	}
	runErr := run(ctx, in, out, errw, resize)

	st := sessionStatus(runErr)
	if proto == protoV5 || proto == protoV4 || proto == protoV4Base64 {
		b, err := json.Marshal(st)
		if err == nil {
			_, err = streams[chanError].Write(b)
		}
		if err != nil {
			s.log.Debug("write session status", "err", err)
		}
		return
	}
	if st.Status != statusSuccess {
		_, _ = streams[chanError].Write([]byte(st.Message))
	}
}

func channelType(want bool, t wsstream.ChannelType) wsstream.ChannelType {
	if want {
		return t
	}
	return wsstream.IgnoreChannel
}

// decodeResizes forwards the JSON terminal sizes the client sends until it stops or
// the session ends.
func decodeResizes(ctx context.Context, r io.Reader, ch chan<- TerminalSize) {
	defer close(ch)
	dec := json.NewDecoder(r)
	for {
		var sz TerminalSize
		if err := dec.Decode(&sz); err != nil {
			return
		}
		select {
		case ch <- sz:
		case <-ctx.Done():
			return
		}
	}
}

const (
	statusSuccess = "Success"
	statusFailure = "Failure"
)

// status is the subset of metav1.Status that clients read from the error channel.
type status struct {
	Status  string         `json:"status,omitempty"`
	Message string         `json:"message,omitempty"`
	Reason  string         `json:"reason,omitempty"`
	Details *statusDetails `json:"details,omitempty"`
	Code    int32          `json:"code,omitempty"`
}

type statusDetails struct {
	Causes []statusCause `json:"causes,omitempty"`
}

type statusCause struct {
	Type    string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

// sessionStatus turns a session's result into the status the client decodes: a
// non-zero exit as NonZeroExitCode with the code as a cause (client-go's
// CodeExitError), anything else as an internal error.
func sessionStatus(err error) status {
	if err == nil {
		return status{Status: statusSuccess}
	}
	var ec exitCoder
	if errors.As(err, &ec) && ec.Exited() {
		return status{
			Status:  statusFailure,
			Reason:  remotecommand.NonZeroExitCodeReason,
			Message: fmt.Sprintf("command terminated with non-zero exit code: %v", ec),
			Details: &statusDetails{Causes: []statusCause{{
				Type: remotecommand.ExitCodeCauseType, Message: strconv.Itoa(ec.ExitStatus()),
			}}},
		}
	}
	return status{
		Status:  statusFailure,
		Reason:  "InternalError",
		Message: fmt.Sprintf("Internal error occurred: %v", err),
		Code:    http.StatusInternalServerError,
	}
}
