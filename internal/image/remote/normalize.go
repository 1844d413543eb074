package remote

import (
	"fmt"

	"github.com/containerd/errdefs"
	"github.com/distribution/reference"
)

// refHelp is appended to reference errors so the person reading one knows the shape
// a reference must have.
const refHelp = "expected [registry[:port]/]repository[:tag][@sha256:<64 hex digits>], e.g. docker.io/library/busybox:1.36"

// Normalize turns a user reference into its canonical form the way kubelet and docker
// do: "busybox" becomes "docker.io/library/busybox:latest". A tag and a digest given
// together are both kept (the digest decides what is pulled). A bad reference is an
// error wrapping errdefs.ErrInvalidArgument.
func Normalize(ref string) (reference.Named, error) {
	if ref == "" {
		return nil, fmt.Errorf("invalid image reference: empty; %s: %w", refHelp, errdefs.ErrInvalidArgument)
	}
	named, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		return nil, fmt.Errorf("invalid image reference %q: %v; %s: %w", ref, err, refHelp, errdefs.ErrInvalidArgument)
	}
	return reference.TagNameOnly(named), nil
}
