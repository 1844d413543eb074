package task

import (
	"context"
	"fmt"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The shim's services return errdefs kinds; GRPCStatus turns them into the status the
// wire carries, once, where ttrpc returns (the shim's server interceptor), and the task
// helper's answers carry the same codes. Each kind is made with WithMessage, so the
// message is the text alone: the controller and containerd read the code, tests and
// people the unchanged message.

func notFound(format string, args ...any) error {
	return withKind(errdefs.ErrNotFound, fmt.Sprintf(format, args...))
}

func invalid(format string, args ...any) error {
	return withKind(errdefs.ErrInvalidArgument, fmt.Sprintf(format, args...))
}

func failedPrecondition(format string, args ...any) error {
	return withKind(errdefs.ErrFailedPrecondition, fmt.Sprintf(format, args...))
}

func internal(format string, args ...any) error {
	return withKind(errdefs.ErrInternal, fmt.Sprintf(format, args...))
}

func alreadyExists(format string, args ...any) error {
	return withKind(errdefs.ErrAlreadyExists, fmt.Sprintf(format, args...))
}

func unimplemented(format string, args ...any) error {
	return withKind(errdefs.ErrNotImplemented, fmt.Sprintf(format, args...))
}

// Errorf is an error of an errdefs kind (errdefs.ErrInvalidArgument, ...) whose text is
// the formatted message alone: what a Runner returns so that the caller gets the
// kind's gRPC code and the message unchanged.
func Errorf(kind error, format string, args ...any) error {
	return withKind(kind, fmt.Sprintf(format, args...))
}

// CodeOf is the gRPC code of err's errdefs kind; false for an error of no kind.
func CodeOf(err error) (codes.Code, bool) { return codeOf(err) }

// KindOf is the errdefs kind of a gRPC code (errdefs.ErrUnknown for one the kit does
// not map): how a Runner turns a code its helper answered back into a kind.
func KindOf(code codes.Code) error { return kindOf(code) }

// withKind is an error of kind whose text is msg alone (fmt.Errorf's "%w" would append
// the kind's name to the message the wire has always carried).
func withKind(kind error, msg string) error {
	if k, ok := kind.(interface{ WithMessage(string) error }); ok {
		return k.WithMessage(msg)
	}
	return kindError{kind: kind, msg: msg}
}

// kindError is a kind errdefs has no WithMessage for (a context error) with a message.
type kindError struct {
	kind error
	msg  string
}

func (e kindError) Error() string { return e.msg }

// Unwrap lets errors.Is and errdefs.Resolve find the kind.
func (e kindError) Unwrap() error { return e.kind }

// kinds pairs each errdefs kind the shim returns with its gRPC code, as containerd's
// errgrpc maps them.
var kinds = []struct {
	kind error
	code codes.Code
}{
	{errdefs.ErrInvalidArgument, codes.InvalidArgument},
	{errdefs.ErrNotFound, codes.NotFound},
	{errdefs.ErrAlreadyExists, codes.AlreadyExists},
	{errdefs.ErrPermissionDenied, codes.PermissionDenied},
	{errdefs.ErrResourceExhausted, codes.ResourceExhausted},
	{errdefs.ErrFailedPrecondition, codes.FailedPrecondition},
	{errdefs.ErrConflict, codes.FailedPrecondition},
	{errdefs.ErrNotModified, codes.FailedPrecondition},
	{errdefs.ErrAborted, codes.Aborted},
	{errdefs.ErrOutOfRange, codes.OutOfRange},
	{errdefs.ErrNotImplemented, codes.Unimplemented},
	{errdefs.ErrInternal, codes.Internal},
	{errdefs.ErrUnavailable, codes.Unavailable},
	{errdefs.ErrDataLoss, codes.DataLoss},
	{errdefs.ErrUnauthenticated, codes.Unauthenticated},
	{context.DeadlineExceeded, codes.DeadlineExceeded},
	{context.Canceled, codes.Canceled},
	{errdefs.ErrUnknown, codes.Unknown},
}

// codeOf is the gRPC code of err's errdefs kind; false for an error of no kind.
func codeOf(err error) (codes.Code, bool) {
	kind := errdefs.Resolve(err)
	for _, k := range kinds {
		if k.kind == kind {
			return k.code, kind != errdefs.ErrUnknown || errdefs.IsUnknown(err)
		}
	}
	return codes.Unknown, false
}

// kindOf is the errdefs kind of a gRPC code (ErrUnknown for one the shim does not map).
func kindOf(code codes.Code) error {
	for _, k := range kinds {
		if k.code == code {
			return k.kind
		}
	}
	return errdefs.ErrUnknown
}

// GRPCStatus converts an error of the shim's services to a gRPC status error with the
// code of its errdefs kind and its text as the message, as containerd's
// errgrpc.ToGRPC does. It is written here rather than imported because errgrpc links
// containerd's typeurl registry (and ~58 KB) into the binary every pod's shim runs, for
// error details the shim never sends. An error that is a status already, or has no
// kind, is returned as it is (ttrpc sends the latter as Unknown).
func GRPCStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	code, ok := codeOf(err)
	if !ok {
		return err
	}
	return status.Error(code, err.Error())
}
