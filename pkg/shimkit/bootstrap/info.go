package bootstrap

import (
	"encoding/json"
	"fmt"
	"strconv"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/opencontainers/runtime-spec/specs-go/features"
	"google.golang.org/protobuf/types/known/anypb"
)

// FeaturesTypeURL is the type URL containerd registers for the OCI runtime features
// document (core/runtime/typeurl.go); the Any's value is the document as JSON.
var FeaturesTypeURL = "types.containerd.io/opencontainers/runtime-spec/" + strconv.Itoa(specs.VersionMajor) + "/features/Features"

// FeaturesAny is an OCI runtime features document as the Any WriteInfo takes.
// A runtime reads it to decide what a handler offers: crisp and containerd 2.x
// advertise recursive read-only mounts only with the "rro" mount option, and user
// namespaces only with the "user" namespace.
func FeaturesAny(f *features.Features) (*anypb.Any, error) {
	data, err := json.Marshal(f)
	if err != nil {
		return nil, fmt.Errorf("encode runtime features: %w", err)
	}
	return &anypb.Any{TypeUrl: FeaturesTypeURL, Value: data}, nil
}
