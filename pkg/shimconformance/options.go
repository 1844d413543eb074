package shimconformance

import (
	"fmt"
	"path/filepath"
	"strings"

	runcoptions "github.com/containerd/containerd/api/types/runc/options"
	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/pelletier/go-toml/v2"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/crisp-runtime/crisp/internal/protofields"
)

// IsRuncShim reports whether a shim takes containerd.runc.v1.Options, judged by its
// binary's name as containerd judges by runtime_type io.containerd.runc.v2.
func IsRuncShim(shim string) bool {
	return strings.Contains(filepath.Base(shim), "runc")
}

// RuntimeOptions encodes a table of runtime options as containerd sends them to a
// shim: containerd.runc.v1.Options when runc is true, else containerd's generic
// runtimeoptions.v1.Options (TypeUrl, ConfigPath, ConfigBody: gVisor, Kata). Keys
// match a field by its Go or proto name, case and underscores aside, as under crisp's
// [runtimes.NAME.options]. An empty table gives nil.
func RuntimeOptions(table map[string]any, runc bool) (*anypb.Any, error) {
	if len(table) == 0 {
		return nil, nil
	}
	var msg proto.Message = &runtimeoptions.Options{}
	if runc {
		msg = &runcoptions.Options{}
	}
	if err := protofields.Set(msg.ProtoReflect(), table); err != nil {
		return nil, err
	}
	data, err := proto.Marshal(msg)
	if err != nil {
		return nil, err
	}
	// containerd's typeurl names a message by its full name alone.
	return &anypb.Any{TypeUrl: string(msg.ProtoReflect().Descriptor().FullName()), Value: data}, nil
}

// ParseOptionsTable parses runtime options written as TOML: either a document of
// key = value lines (the body of a [runtimes.NAME.options] table) or the inside of an
// inline table, `BinaryName = "/usr/bin/runc", Root = "/run/r"`.
func ParseOptionsTable(text string) (map[string]any, error) {
	table := map[string]any{}
	if err := toml.Unmarshal([]byte(text), &table); err == nil {
		return table, nil
	}
	var wrapped struct {
		O map[string]any `toml:"o"`
	}
	if err := toml.Unmarshal([]byte("o = {"+text+"}"), &wrapped); err != nil {
		return nil, fmt.Errorf("runtime options %q are neither TOML lines nor an inline table: %w", text, err)
	}
	return wrapped.O, nil
}
