// Package protofields sets a protobuf message's fields from a TOML table, the way
// containerd turns a runtime's `options` table into its runtime options message: keys
// match field names without case or underscores. It is shared by criserver's
// task-only sandboxer and the shim conformance suite; it must not import either.
package protofields

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"google.golang.org/protobuf/reflect/protoreflect"
)

func fieldKey(s string) string { return strings.ToLower(strings.ReplaceAll(s, "_", "")) }

// Set sets the fields of m named by table's keys from TOML values (string, bool,
// int64); an unknown key, a list or map field, or a value of the wrong kind is an error
// naming the key.
func Set(m protoreflect.Message, table map[string]any) error {
	fields := m.Descriptor().Fields()
	byKey := map[string]protoreflect.FieldDescriptor{}
	var names []string
	for i := 0; i < fields.Len(); i++ {
		f := fields.Get(i)
		byKey[fieldKey(string(f.Name()))] = f
		names = append(names, string(f.Name()))
	}
	keys := make([]string, 0, len(table))
	for k := range table {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		f, ok := byKey[fieldKey(k)]
		if !ok || f.IsList() || f.IsMap() {
			return fmt.Errorf("unknown key %q for %s (have %s)", k, m.Descriptor().FullName(), strings.Join(names, ", "))
		}
		v, err := protoValue(f, table[k])
		if err != nil {
			return fmt.Errorf("%s: %w", k, err)
		}
		m.Set(f, v)
	}
	return nil
}

// protoValue converts a TOML value (string, bool, int64) to a field's kind.
func protoValue(f protoreflect.FieldDescriptor, v any) (protoreflect.Value, error) {
	switch f.Kind() {
	case protoreflect.StringKind:
		if s, ok := v.(string); ok {
			return protoreflect.ValueOfString(s), nil
		}
	case protoreflect.BoolKind:
		if b, ok := v.(bool); ok {
			return protoreflect.ValueOfBool(b), nil
		}
	case protoreflect.Uint32Kind:
		if n, ok := v.(int64); ok && n >= 0 && n <= math.MaxUint32 {
			return protoreflect.ValueOfUint32(uint32(n)), nil
		}
	}
	return protoreflect.Value{}, fmt.Errorf("want a %s, got %v (%T)", f.Kind(), v, v)
}
