package task

import (
	"errors"
	"time"

	"github.com/crisp-runtime/crisp/internal/fifoio"
)

// Errors of stdio.attach, mapped to status codes by the service.
var (
	errAttachClosed   = errors.New("the process's streams are closed")
	errAttachNoStdin  = errors.New("the process has no stdin")
	errAttachNoOutput = errors.New("the process's output is not copied by the shim (it goes to the caller's FIFOs)")
)

// attach connects an attach session's FIFOs ("" = none) to the process (see
// fifoio.Attach). A terminal's combined output goes to the session's stdout.
func (s *stdio) attach(stdinPath, stdoutPath, stderrPath string) error {
	err := s.sessions.Attach(stdinPath, stdoutPath, stderrPath)
	switch {
	case errors.Is(err, fifoio.ErrAttachClosed):
		return errAttachClosed
	case errors.Is(err, fifoio.ErrNoStdin):
		return errAttachNoStdin
	case errors.Is(err, fifoio.ErrNoOutput):
		return errAttachNoOutput
	}
	return err
}

// attachStdinFinish bounds how long CloseIO waits for ended attach sessions' stdin to
// be copied into the process (which may not be reading it). Only ended sessions are
// waited for: one still writing would hold CloseIO for nothing.
const attachStdinFinish = 2 * time.Second

// detachAll ends the attach sessions' stdin copies and refuses new sessions; the output
// sinks end with their streams.
func (s *stdio) detachAll() {
	s.sessions.Close()
}
