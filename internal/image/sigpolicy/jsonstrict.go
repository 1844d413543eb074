package sigpolicy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// entryError is a problem with one entry of a JSON document, located by its
// JSON path (default[0].keyPath, transports.docker["example.com"]…).
type entryError struct {
	path string
	err  error
}

func (e *entryError) Error() string {
	if e.path == "" {
		return e.err.Error()
	}
	return e.path + ": " + e.err.Error()
}

func (e *entryError) Unwrap() error { return e.err }

// errorAt returns an entryError at path.
func errorAt(path, format string, args ...any) error {
	return &entryError{path: path, err: fmt.Errorf(format, args...)}
}

// childPath is the JSON path of member key of the object at parent: a dotted
// name where key is an identifier, else a quoted index, so that any key reads
// back unambiguously.
func childPath(parent, key string) string {
	if isIdentifier(key) {
		if parent == "" {
			return key
		}
		return parent + "." + key
	}
	return parent + "[" + strconv.Quote(key) + "]"
}

// quotedPath is childPath always in the quoted form, for scopes, which read as
// names rather than fields.
func quotedPath(parent, key string) string {
	return parent + "[" + strconv.Quote(key) + "]"
}

// indexPath is the JSON path of element i of the array at parent.
func indexPath(parent string, i int) string {
	return parent + "[" + strconv.Itoa(i) + "]"
}

func isIdentifier(s string) bool {
	if s == "" {
		return false
	}
	for i, c := range s {
		switch {
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
		case i > 0 && c >= '0' && c <= '9':
		default:
			return false
		}
	}
	return true
}

// checkSyntax reports a JSON syntax error with its line and column, which
// encoding/json only gives as a byte offset.
func checkSyntax(data []byte) error {
	var v any
	err := json.Unmarshal(data, &v)
	var se *json.SyntaxError
	if errors.As(err, &se) {
		line, col := lineCol(data, se.Offset)
		return fmt.Errorf("invalid JSON at line %d, column %d: %w", line, col, err)
	}
	if err != nil {
		return fmt.Errorf("invalid JSON: %w", err)
	}
	return nil
}

func lineCol(data []byte, offset int64) (line, col int) {
	if offset > int64(len(data)) {
		offset = int64(len(data))
	}
	before := data[:offset]
	line = bytes.Count(before, []byte("\n")) + 1
	col = int(offset) - (bytes.LastIndexByte(before, '\n') + 1)
	return line, col
}

// jsonKind names the kind of the JSON value raw, for messages.
func jsonKind(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case '{':
		return "an object"
	case '[':
		return "a list"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	default:
		return "a number"
	}
}

// decodeObject decodes the JSON object raw at path strictly, as containers/image
// does for a security policy: duplicated keys, keys that member does not know
// (it returns nil) and values of the wrong type are errors, since a silently
// ignored typo could weaken the policy. member returns where to decode the value
// of key, or an error of its own.
func decodeObject(raw json.RawMessage, path string, member func(key string) (any, error)) error {
	if jsonKind(raw) != "an object" {
		return errorAt(path, "must be a JSON object, not %s", jsonKind(raw))
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if _, err := dec.Token(); err != nil { // the '{' checked above
		return errorAt(path, "%w", err)
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return errorAt(path, "%w", err)
		}
		key, ok := tok.(string)
		if !ok { // encoding/json rejects non-string keys before this
			return errorAt(path, "unexpected %v in place of a key", tok)
		}
		if seen[key] {
			return errorAt(childPath(path, key), "duplicate key")
		}
		seen[key] = true
		dst, err := member(key)
		if err != nil {
			return err
		}
		if dst == nil {
			return errorAt(childPath(path, key), "unknown field %q", key)
		}
		if err := dec.Decode(dst); err != nil {
			return errorAt(childPath(path, key), "%s", describeDecodeError(err))
		}
	}
	if _, err := dec.Token(); err != nil { // '}'
		return errorAt(path, "%w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errorAt(path, "unexpected data after the JSON object")
	}
	return nil
}

// describeDecodeError makes encoding/json's type errors read in JSON terms
// ("a number where a string is expected") rather than Go ones.
func describeDecodeError(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		want := "a different type"
		switch te.Type.String() {
		case "string":
			want = "a string"
		case "[]string", "[][]uint8":
			want = "a list of strings"
		case "[]uint8":
			want = "a base64 string"
		}
		return fmt.Sprintf("%s where %s is expected", te.Value, want)
	}
	return err.Error()
}
