package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/containerd/api/types"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/opencontainers/runtime-spec/specs-go/features"
	"google.golang.org/protobuf/proto"
)

// infoTimeout bounds a shim's -info: it only prints what it was built with.
const infoTimeout = 10 * time.Second

// featuresTypeURL is the type URL containerd registers for the OCI runtime features
// document (core/runtime/typeurl.go), as the kit's bootstrap.FeaturesTypeURL: that
// package is the shims' side, built on crisp's copies of containerd's API types,
// which cannot share a binary with containerd's own.
var featuresTypeURL = "types.containerd.io/opencontainers/runtime-spec/" + strconv.Itoa(specs.VersionMajor) + "/features/Features"

// ShimFeatures asks a handler's shim binary what it can run (`<shim> -info`, as
// containerd 2.x does) and returns its OCI runtime features document, or nil when the
// shim prints none.
func ShimFeatures(ctx context.Context, shim string) (*features.Features, error) {
	bin, err := ResolveShim(shim)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, infoTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-info")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s -info: %w: %s", bin, err, strings.TrimSpace(stderr.String()))
	}
	feat, err := parseInfoFeatures(stdout.Bytes())
	if err != nil {
		return nil, fmt.Errorf("%s -info: %w", bin, err)
	}
	return feat, nil
}

// parseInfoFeatures decodes -info's RuntimeInfo and returns its features document
// (nil when it carries none).
func parseInfoFeatures(data []byte) (*features.Features, error) {
	var info types.RuntimeInfo
	if err := proto.Unmarshal(data, &info); err != nil {
		return nil, fmt.Errorf("decode RuntimeInfo: %w", err)
	}
	f := info.GetFeatures()
	if f == nil {
		return nil, nil
	}
	if f.GetTypeUrl() != featuresTypeURL {
		return nil, fmt.Errorf("runtime features of type %q, want %q", f.GetTypeUrl(), featuresTypeURL)
	}
	var feat features.Features
	if err := json.Unmarshal(f.GetValue(), &feat); err != nil {
		return nil, fmt.Errorf("decode runtime features: %w", err)
	}
	return &feat, nil
}
