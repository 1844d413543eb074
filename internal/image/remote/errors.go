package remote

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"

	"github.com/containerd/errdefs"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// classify turns an error from talking to ep into one a person can act on, wrapping
// the errdefs kind callers map to CRI status codes. what says what was being fetched
// ("manifest docker.io/library/busybox:1.36", "layer sha256:..."); withCreds says
// whether credentials were sent to ep.
func classify(err error, ep endpoint, what string, withCreds bool) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	where := ep.where()
	var terr *transport.Error
	if errors.As(err, &terr) {
		switch {
		case terr.StatusCode == http.StatusUnauthorized || hasCode(terr, transport.UnauthorizedErrorCode):
			if withCreds {
				return fmt.Errorf("%s rejected the credentials given for it (401 Unauthorized): check the username and password or token (%w): %w", where, err, errdefs.ErrUnauthenticated)
			}
			return fmt.Errorf("%s requires credentials and none were given for it (401 Unauthorized), or the repository does not exist (%w): %w", where, err, errdefs.ErrUnauthenticated)
		case terr.StatusCode == http.StatusForbidden || hasCode(terr, transport.DeniedErrorCode):
			if withCreds {
				return fmt.Errorf("%s denied access to %s (403 Forbidden): the credentials do not allow pulling it (%w): %w", where, what, err, errdefs.ErrPermissionDenied)
			}
			return fmt.Errorf("%s denied access to %s (403 Forbidden) and no credentials were given for it (%w): %w", where, what, err, errdefs.ErrPermissionDenied)
		case terr.StatusCode == http.StatusNotFound || hasCode(terr, transport.ManifestUnknownErrorCode) ||
			hasCode(terr, transport.NameUnknownErrorCode) || hasCode(terr, transport.BlobUnknownErrorCode):
			return fmt.Errorf("%s not found on %s (%w): %w", what, where, err, errdefs.ErrNotFound)
		case terr.StatusCode == http.StatusTooManyRequests || hasCode(terr, transport.TooManyRequestsErrorCode):
			return fmt.Errorf("%s is rate limiting pulls (429 Too Many Requests) (%w): %w", where, err, errdefs.ErrResourceExhausted)
		}
		return fmt.Errorf("%s: %w", where, err)
	}
	var nerr net.Error
	if errors.As(err, &nerr) {
		return fmt.Errorf("cannot reach %s: %w: %w", where, err, errdefs.ErrUnavailable)
	}
	return err
}

func hasCode(e *transport.Error, code transport.ErrorCode) bool {
	for _, d := range e.Errors {
		if d.Code == code {
			return true
		}
	}
	return false
}

// where names ep in messages: "registry docker.io", "mirror https://m.example/hub".
func (ep endpoint) where() string {
	if ep.mirror {
		return "mirror " + ep.display
	}
	return "registry " + ep.host
}
