package sigpolicy

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/distribution/reference"
)

const (
	// maxPolicySize bounds what Load reads: policy files are a few KiB.
	maxPolicySize = 4 << 20
	// maxKeyFileSize bounds a key file: a PEM public key is well under 4 KiB.
	maxKeyFileSize = 1 << 20
)

// Requirement types of containers-policy.json(5).
const (
	typeInsecureAcceptAnything = "insecureAcceptAnything"
	typeReject                 = "reject"
	typeSignedBy               = "signedBy"
	typeSignedBaseLayer        = "signedBaseLayer"
	typeSigstoreSigned         = "sigstoreSigned"
)

// dockerTransport is the only transport a CRI pull goes through.
const dockerTransport = "docker"

// Policy is a checked containers-policy.json with its keys loaded; it is
// immutable and safe for concurrent use.
type Policy struct {
	source string
	global *scope
	docker map[string]*scope // nil when there is no transports.docker section
}

// scope is one list of requirements and where it was found.
type scope struct {
	path string // JSON path, for errors: default, transports.docker["example.com"]
	name string // for Describe: default, scope "example.com"
	reqs []*requirement
}

// requirement is one entry of a requirement list.
type requirement struct {
	typ      string
	keys     []*publicKey // sigstoreSigned only
	identity identityRule // sigstoreSigned only
}

// Load reads and checks a containers-policy.json file; errors name the file and the JSON path of the bad entry.
func Load(path string) (*Policy, error) {
	data, err := readLimited(path, maxPolicySize)
	if err != nil {
		return nil, fmt.Errorf("signature policy %s: %w", path, err)
	}
	return Parse(data, path)
}

// Parse is Load from bytes; source names them in errors. Relative key paths are refused, as their meaning would depend on the daemon's working directory.
func Parse(data []byte, source string) (*Policy, error) {
	p, err := parsePolicy(data, source)
	if err != nil {
		return nil, fmt.Errorf("signature policy %s: %w", source, err)
	}
	return p, nil
}

// readLimited reads the regular file at path, refusing one larger than limit.
func readLimited(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, limit)
	}
	return data, nil
}

func parsePolicy(data []byte, source string) (*Policy, error) {
	if err := checkSyntax(data); err != nil {
		return nil, err
	}
	var rawDefault, rawTransports json.RawMessage
	if err := decodeObject(data, "", func(key string) (any, error) {
		switch key {
		case "default":
			return &rawDefault, nil
		case "transports":
			return &rawTransports, nil
		}
		return nil, errorAt("", "unknown top-level field %q (only \"default\" and \"transports\" exist)", key)
	}); err != nil {
		return nil, err
	}
	if rawDefault == nil {
		return nil, errorAt("default", "missing: the global default list of requirements is mandatory")
	}
	p := &Policy{source: source}
	reqs, err := parseRequirements(rawDefault, "default", true)
	if err != nil {
		return nil, err
	}
	p.global = &scope{path: "default", name: "default", reqs: reqs}
	if rawTransports != nil {
		if err := p.parseTransports(rawTransports); err != nil {
			return nil, err
		}
	}
	return p, nil
}

func (p *Policy) parseTransports(raw json.RawMessage) error {
	const path = "transports"
	transports := map[string]json.RawMessage{}
	if err := decodeObject(raw, path, func(key string) (any, error) {
		return &decodeInto{m: transports, key: key}, nil
	}); err != nil {
		return err
	}
	// Sorted, so that of several errors the same one is reported every time.
	for _, transport := range slices.Sorted(maps.Keys(transports)) {
		rawScopes := transports[transport]
		tpath := childPath(path, transport)
		honoured := transport == dockerTransport
		scopes := map[string]json.RawMessage{}
		if err := decodeObject(rawScopes, tpath, func(key string) (any, error) {
			return &decodeInto{m: scopes, key: key}, nil
		}); err != nil {
			return err
		}
		if honoured {
			p.docker = make(map[string]*scope, len(scopes))
		}
		for _, name := range slices.Sorted(maps.Keys(scopes)) {
			rawReqs := scopes[name]
			spath := quotedPath(tpath, name)
			reqs, err := parseRequirements(rawReqs, spath, honoured)
			if err != nil {
				return err
			}
			if honoured {
				p.docker[name] = &scope{path: spath, name: fmt.Sprintf("scope %q", name), reqs: reqs}
			}
		}
	}
	return nil
}

// decodeInto stores a member's raw value in a map, as decodeObject hands out
// pointers and a map element has no address.
type decodeInto struct {
	m   map[string]json.RawMessage
	key string
}

func (d *decodeInto) UnmarshalJSON(b []byte) error {
	d.m[d.key] = append(json.RawMessage(nil), b...)
	return nil
}

// parseRequirements parses a requirement list. When !honoured (a transport a CRI
// pull never uses) the entries are checked for shape and a known type only:
// refusing, say, a signedBy for docker-daemon would make a policy.json shared
// with podman unusable for no benefit, since crisp never evaluates it.
func parseRequirements(raw json.RawMessage, path string, honoured bool) ([]*requirement, error) {
	if jsonKind(raw) != "a list" {
		return nil, errorAt(path, "must be a list of requirements, not %s", jsonKind(raw))
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, errorAt(path, "%w", err)
	}
	if len(items) == 0 {
		return nil, errorAt(path, "the list of requirements must not be empty (use [{\"type\": \"insecureAcceptAnything\"}] to require nothing)")
	}
	reqs := make([]*requirement, 0, len(items))
	for i, item := range items {
		r, err := parseRequirement(item, indexPath(path, i), honoured)
		if err != nil {
			return nil, err
		}
		reqs = append(reqs, r)
	}
	return reqs, nil
}

// requirementType reads the "type" member of a requirement or identity object.
func requirementType(raw json.RawMessage, path string) (string, error) {
	var typ *string
	if err := decodeObject(raw, path, func(key string) (any, error) {
		if key == "type" {
			return &typ, nil
		}
		return new(json.RawMessage), nil
	}); err != nil {
		return "", err
	}
	if typ == nil {
		return "", errorAt(childPath(path, "type"), "missing")
	}
	return *typ, nil
}

func parseRequirement(raw json.RawMessage, path string, honoured bool) (*requirement, error) {
	typ, err := requirementType(raw, path)
	if err != nil {
		return nil, err
	}
	switch typ {
	case typeInsecureAcceptAnything, typeReject, typeSigstoreSigned, typeSignedBy, typeSignedBaseLayer:
	default:
		return nil, errorAt(childPath(path, "type"), "unknown requirement type %q", typ)
	}
	if !honoured {
		return &requirement{typ: typ}, nil
	}
	switch typ {
	case typeInsecureAcceptAnything, typeReject:
		if err := decodeObject(raw, path, func(key string) (any, error) {
			if key == "type" {
				return new(string), nil
			}
			return nil, errorAt(childPath(path, key), "unknown field %q in a %s requirement", key, typ)
		}); err != nil {
			return nil, err
		}
		return &requirement{typ: typ}, nil
	case typeSignedBy:
		return nil, errorAt(path, "requirement type %q (GPG simple signing) is not supported by crisp; use sigstoreSigned with a public key", typ)
	case typeSignedBaseLayer:
		return nil, errorAt(path, "requirement type %q is not supported by crisp", typ)
	default:
		return parseSigstoreSigned(raw, path)
	}
}

func parseSigstoreSigned(raw json.RawMessage, path string) (*requirement, error) {
	var (
		keyPath     *string
		keyPaths    *[]string
		keyData     *[]byte
		keyDatas    *[][]byte
		rawIdentity json.RawMessage
		hasIdentity bool
	)
	if err := decodeObject(raw, path, func(key string) (any, error) {
		switch key {
		case "type": // checked by requirementType
			return new(string), nil
		case "keyPath":
			return &keyPath, nil
		case "keyPaths":
			return &keyPaths, nil
		case "keyData":
			return &keyData, nil
		case "keyDatas":
			return &keyDatas, nil
		case "signedIdentity":
			hasIdentity = true
			return &rawIdentity, nil
		case "fulcio":
			return nil, errorAt(childPath(path, key), "sigstoreSigned with %q (keyless signatures with Fulcio certificates) is not supported by crisp; use keyPath, keyPaths, keyData or keyDatas", key)
		case "pki":
			return nil, errorAt(childPath(path, key), "sigstoreSigned with %q (X.509 certificate signatures) is not supported by crisp; use keyPath, keyPaths, keyData or keyDatas", key)
		case "rekorPublicKeyPath", "rekorPublicKeyPaths", "rekorPublicKeyData", "rekorPublicKeyDatas":
			return nil, errorAt(childPath(path, key), "sigstoreSigned with %q (Rekor transparency log verification) is not supported by crisp", key)
		}
		return nil, errorAt(childPath(path, key), "unknown field %q in a sigstoreSigned requirement", key)
	}); err != nil {
		return nil, err
	}
	sources := 0
	for _, present := range []bool{keyPath != nil, keyPaths != nil, keyData != nil, keyDatas != nil} {
		if present {
			sources++
		}
	}
	if sources != 1 {
		return nil, errorAt(path, "exactly one of keyPath, keyPaths, keyData and keyDatas must be present, found %d", sources)
	}

	keys, err := loadKeys(path, keyPath, keyPaths, keyData, keyDatas)
	if err != nil {
		return nil, err
	}
	r := &requirement{typ: typeSigstoreSigned, keys: keys}
	r.identity = identityRule{typ: matchRepoDigestOrExact}
	if hasIdentity {
		if r.identity, err = parseIdentity(rawIdentity, childPath(path, "signedIdentity")); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// loadKeys loads the keys of the sigstoreSigned requirement at path from the one
// of its key members that is set.
func loadKeys(path string, keyPath *string, keyPaths *[]string, keyData *[]byte, keyDatas *[][]byte) ([]*publicKey, error) {
	var keys []*publicKey
	switch {
	case keyPath != nil:
		k, err := loadKeyFile(*keyPath, childPath(path, "keyPath"))
		if err != nil {
			return nil, err
		}
		keys = append(keys, k)
	case keyPaths != nil:
		kpath := childPath(path, "keyPaths")
		if len(*keyPaths) == 0 {
			return nil, errorAt(kpath, "must not be empty")
		}
		for i, f := range *keyPaths {
			k, err := loadKeyFile(f, indexPath(kpath, i))
			if err != nil {
				return nil, err
			}
			keys = append(keys, k)
		}
	case keyData != nil:
		k, err := parseKey(*keyData, "keyData of "+path, "", childPath(path, "keyData"))
		if err != nil {
			return nil, err
		}
		keys = append(keys, k)
	default:
		kpath := childPath(path, "keyDatas")
		if len(*keyDatas) == 0 {
			return nil, errorAt(kpath, "must not be empty")
		}
		for i, d := range *keyDatas {
			k, err := parseKey(d, fmt.Sprintf("keyDatas[%d] of %s", i, path), "", indexPath(kpath, i))
			if err != nil {
				return nil, err
			}
			keys = append(keys, k)
		}
	}
	return keys, nil
}

// loadKeyFile reads the public key file at file for the entry at path.
func loadKeyFile(file, path string) (*publicKey, error) {
	if file == "" {
		return nil, errorAt(path, "must not be empty")
	}
	if !filepath.IsAbs(file) {
		return nil, errorAt(path, "key file %q is not an absolute path (a relative one would depend on the daemon's working directory)", file)
	}
	data, err := readLimited(file, maxKeyFileSize)
	if err != nil {
		return nil, errorAt(path, "reading public key: %w", err)
	}
	return parseKey(data, file, file, path)
}

// parseIdentity parses a signedIdentity object.
func parseIdentity(raw json.RawMessage, path string) (identityRule, error) {
	typ, err := requirementType(raw, path)
	if err != nil {
		return identityRule{}, err
	}
	var fields []string
	switch typ {
	case matchExact, matchRepoDigestOrExact, matchRepository:
	case exactReference:
		fields = []string{"dockerReference"}
	case exactRepository:
		fields = []string{"dockerRepository"}
	case remapIdentity:
		fields = []string{"prefix", "signedPrefix"}
	default:
		return identityRule{}, errorAt(childPath(path, "type"), "unknown signedIdentity type %q", typ)
	}
	values := map[string]*string{}
	if err := decodeObject(raw, path, func(key string) (any, error) {
		if key == "type" {
			return new(string), nil
		}
		for _, f := range fields {
			if key == f {
				v := new(string)
				values[key] = v
				return v, nil
			}
		}
		return nil, errorAt(childPath(path, key), "unknown field %q in a %s signedIdentity", key, typ)
	}); err != nil {
		return identityRule{}, err
	}
	for _, f := range fields {
		if values[f] == nil {
			return identityRule{}, errorAt(childPath(path, f), "missing (required by %s)", typ)
		}
	}

	rule := identityRule{typ: typ}
	switch typ {
	case exactReference:
		s := *values["dockerReference"]
		ref, err := reference.ParseNormalizedNamed(s)
		if err != nil {
			return identityRule{}, errorAt(childPath(path, "dockerReference"), "invalid reference %q: %w", s, err)
		}
		if reference.IsNameOnly(ref) {
			return identityRule{}, errorAt(childPath(path, "dockerReference"), "%q has neither a tag nor a digest", s)
		}
		rule.ref = ref
	case exactRepository:
		s := *values["dockerRepository"]
		ref, err := reference.ParseNormalizedNamed(s)
		if err != nil {
			return identityRule{}, errorAt(childPath(path, "dockerRepository"), "invalid repository %q: %w", s, err)
		}
		rule.ref = ref
	case remapIdentity:
		for _, f := range fields {
			if err := validateRemapPrefix(*values[f]); err != nil {
				return identityRule{}, errorAt(childPath(path, f), "%w", err)
			}
		}
		rule.prefix, rule.signedPrefix = *values["prefix"], *values["signedPrefix"]
	}
	return rule, nil
}
