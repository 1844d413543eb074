package spec

import (
	"fmt"

	"github.com/containerd/errdefs"
)

// kindError carries an errdefs kind (so errdefs.IsInvalidArgument and friends, and the
// CRI's gRPC code mapping, see it) while its message stays the sentence a person reads.
type kindError struct {
	kind error
	msg  string
}

func (e *kindError) Error() string { return e.msg }
func (e *kindError) Unwrap() error { return e.kind }

// invalidf is an InvalidArgument error: the request (or the caller's input) is wrong.
func invalidf(format string, args ...any) error {
	return &kindError{kind: errdefs.ErrInvalidArgument, msg: fmt.Sprintf(format, args...)}
}

// notFoundf is a NotFound error: something the request names does not exist.
func notFoundf(format string, args ...any) error {
	return &kindError{kind: errdefs.ErrNotFound, msg: fmt.Sprintf(format, args...)}
}

// notImplementedf is a NotImplemented error: a CRI feature crisp does not offer.
func notImplementedf(format string, args ...any) error {
	return &kindError{kind: errdefs.ErrNotImplemented, msg: fmt.Sprintf(format, args...)}
}

// failedPreconditionf is a FailedPrecondition error: the host is not set up for what
// the request asks (an administrator can fix it; retrying as is will not help).
func failedPreconditionf(format string, args ...any) error {
	return &kindError{kind: errdefs.ErrFailedPrecondition, msg: fmt.Sprintf(format, args...)}
}
