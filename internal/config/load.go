package config

import (
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/knadh/koanf/maps"
	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/confmap"
	"github.com/knadh/koanf/providers/env/v2"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/providers/posflag"
	"github.com/knadh/koanf/v2"
	"github.com/spf13/pflag"
)

// Load resolves the configuration: DefaultConfig, overridden by the
// YAML file named by fs's --config flag, by LOCKD_* variables from environ
// (nil means os.Environ), and by the flags set in fs. fs must have been set up
// by RegisterFlags and parsed; nil means no file and no flags.
//
// It returns the parts: Config.Server for server.New, Config.Backend for
// backend.Open. The error, if any, joins one *KeyError per problem; each
// names its key.
func Load(fs *pflag.FlagSet, environ func() []string) (Config, error) {
	if environ == nil {
		environ = os.Environ
	}
	var src sources
	if fs != nil {
		if f := fs.Lookup(configFlag); f != nil && f.Value.String() != "" {
			path := f.Value.String()
			b, err := file.Provider(path).ReadBytes()
			if err != nil {
				return Config{}, fmt.Errorf("read config file: %w", err)
			}
			src.file, src.fileName = b, path
		}
		src.flags = fs
	}
	src.environ = environ
	return load(src)
}

type sources struct {
	file     []byte
	fileName string
	environ  func() []string
	flags    *pflag.FlagSet
}

// layer is one source's values, already converted to each key's Go type.
type layer struct {
	values map[string]any    // key → typed value
	origin map[string]string // key → source description
}

func load(src sources) (Config, error) {
	// Every layer is read before any error is returned, so one run reports
	// every problem, as one flat errors.Join of *KeyErrors.
	var errs []error
	layers := []layer{defaultsLayer()}
	if src.file != nil {
		l, lerrs := fileLayer(src.file, src.fileName)
		layers, errs = append(layers, l), append(errs, lerrs...)
	}
	if src.environ != nil {
		l, lerrs := envLayer(src.environ)
		layers, errs = append(layers, l), append(errs, lerrs...)
	}
	if src.flags != nil {
		l, lerrs := flagLayer(src.flags)
		layers, errs = append(layers, l), append(errs, lerrs...)
	}
	if len(errs) > 0 {
		return Config{}, errors.Join(errs...)
	}

	k := koanf.New(".")
	origin := map[string]string{}
	for _, l := range layers {
		if err := k.Load(confmap.Provider(l.values, "."), nil); err != nil {
			return Config{}, fmt.Errorf("merge configuration: %w", err)
		}
		for key, o := range l.origin {
			origin[key] = o
		}
	}
	var cfg Config
	for i := range keys {
		key := &keys[i]
		key.set(&cfg, k.Get(key.Name))
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, validationErrors(err, origin)
	}
	return cfg, nil
}

func defaultsLayer() layer {
	def := DefaultConfig()
	l := layer{values: map[string]any{}, origin: map[string]string{}}
	for i := range keys {
		key := &keys[i]
		l.values[key.Name] = key.get(&def)
		l.origin[key.Name] = "default"
	}
	return l
}

// fileLayer parses a YAML configuration file.
func fileLayer(b []byte, name string) (layer, []error) {
	l := layer{values: map[string]any{}, origin: map[string]string{}}
	source := "file " + name
	mp, err := yaml.Parser().Unmarshal(b)
	if err != nil {
		return l, []error{&syntaxError{source: source, err: err}}
	}
	maps.IntfaceKeysToStrings(mp)
	flat := map[string]any{}
	var errs []error
	flatten(mp, "", flat, func(path string) {
		errs = append(errs, &KeyError{Key: path, Source: source, Err: errors.New("set more than once")})
	})
	for _, path := range sortedKeys(flat) {
		v := flat[path]
		key, ok := keyByName[path]
		switch {
		case ok && v == nil:
			// A null value counts as unset.
		case ok:
			tv, err := convert(key, v)
			if err != nil {
				errs = append(errs, &KeyError{Key: path, Source: source, Err: err})
				continue
			}
			l.values[path], l.origin[path] = tv, source
		case sections[path] && isEmpty(v):
			// An empty or null section ("lock:" with nothing under it).
		default:
			errs = append(errs, &KeyError{Key: path, Source: source, Err: ErrUnknownKey})
		}
	}
	return l, errs
}

// flatten turns a nested map into dotted paths. A path reached twice (a
// dotted key next to the same nested one) is reported through dup.
func flatten(m map[string]any, prefix string, out map[string]any, dup func(string)) {
	for _, k := range sortedKeys(m) {
		path := k
		if prefix != "" {
			path = prefix + "." + k
		}
		// Descend into mappings, except under a key: a mapping as a key's
		// value is a type error, reported with the key's name.
		if sub, ok := m[k].(map[string]any); ok && len(sub) > 0 && keyByName[path] == nil {
			flatten(sub, path, out, dup)
			continue
		}
		if _, seen := out[path]; seen {
			dup(path)
			continue
		}
		out[path] = m[k]
	}
}

func isEmpty(v any) bool {
	m, ok := v.(map[string]any)
	return v == nil || ok && len(m) == 0
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// envLayer reads LOCKD_* variables. Unknown ones are errors; reserved ones
// and empty values are ignored.
func envLayer(environ func() []string) (layer, []error) {
	l := layer{values: map[string]any{}, origin: map[string]string{}}
	var errs []error
	p := env.Provider(".", env.Opt{
		Prefix:      envPrefix,
		EnvironFunc: environ,
		TransformFunc: func(name, value string) (string, any) {
			if reserved(name) || value == "" {
				return "", nil
			}
			key, ok := keyByEnv[name]
			if !ok {
				errs = append(errs, &KeyError{Key: name, Source: "env", Err: ErrUnknownKey})
				return "", nil
			}
			source := "env " + name
			tv, err := convert(key, value)
			if err != nil {
				errs = append(errs, &KeyError{Key: key.Name, Source: source, Err: err})
				return "", nil
			}
			l.values[key.Name], l.origin[key.Name] = tv, source
			return key.Name, tv
		},
	})
	if _, err := p.Read(); err != nil {
		return l, []error{fmt.Errorf("read environment: %w", err)}
	}
	sort.Slice(errs, func(i, j int) bool { return errs[i].Error() < errs[j].Error() })
	return l, errs
}

// flagLayer reads the flags set on the command line.
func flagLayer(fs *pflag.FlagSet) (layer, []error) {
	l := layer{values: map[string]any{}, origin: map[string]string{}}
	var errs []error
	p := posflag.ProviderWithFlag(fs, ".", nil, func(f *pflag.Flag) (string, any) {
		key, ok := keyByFlag[f.Name]
		if !ok || !f.Changed {
			// Not a key (--config, --help), or left at its default.
			return "", nil
		}
		source := "flag --" + f.Name
		tv, err := convert(key, f.Value.String())
		if err != nil {
			errs = append(errs, &KeyError{Key: key.Name, Source: source, Err: err})
			return "", nil
		}
		l.values[key.Name], l.origin[key.Name] = tv, source
		return key.Name, tv
	})
	if _, err := p.Read(); err != nil {
		return l, []error{fmt.Errorf("read flags: %w", err)}
	}
	return l, errs
}

// convert turns a raw value (a YAML scalar or sequence, or a string from the
// environment or a flag) into key's Go type.
func convert(key *Key, v any) (any, error) {
	switch key.kind {
	case kindString:
		if s, ok := v.(string); ok {
			return s, nil
		}
		return nil, fmt.Errorf("want a string, got %s", describe(v))
	case kindDuration:
		var s string
		switch x := v.(type) {
		case string:
			s = x
		case int:
			s = strconv.Itoa(x)
		case time.Duration:
			return x, nil
		default:
			return nil, fmt.Errorf("want a duration such as 15s, got %s", describe(v))
		}
		d, err := time.ParseDuration(s)
		if err != nil {
			return nil, fmt.Errorf("invalid duration %q (want a Go duration such as 300ms or 15s)", s)
		}
		return d, nil
	case kindBool:
		switch x := v.(type) {
		case bool:
			return x, nil
		case string:
			b, err := strconv.ParseBool(x)
			if err != nil {
				return nil, fmt.Errorf("invalid boolean %q (want true or false)", x)
			}
			return b, nil
		}
		return nil, fmt.Errorf("want true or false, got %s", describe(v))
	case kindInt:
		switch x := v.(type) {
		case int64:
			return x, nil
		case int:
			return int64(x), nil
		case uint64:
			if x <= math.MaxInt64 {
				return int64(x), nil
			}
		case string:
			n, err := strconv.ParseInt(x, 10, 64)
			if err != nil || strings.TrimSpace(x) != x || strings.HasPrefix(x, "+") {
				return nil, fmt.Errorf("invalid integer %q (want decimal digits, e.g. 67108864)", x)
			}
			return n, nil
		}
		return nil, fmt.Errorf("want an integer, got %s", describe(v))
	case kindFloat:
		switch x := v.(type) {
		case float64:
			return x, nil
		case int:
			return float64(x), nil
		case int64:
			return float64(x), nil
		case uint64:
			return float64(x), nil
		case string:
			f, err := strconv.ParseFloat(x, 64)
			if err != nil || strings.TrimSpace(x) != x {
				return nil, fmt.Errorf("invalid number %q (want a decimal number such as 0.25)", x)
			}
			return f, nil
		}
		return nil, fmt.Errorf("want a number, got %s", describe(v))
	case kindList:
		switch x := v.(type) {
		case string:
			return splitList(x), nil
		case []string:
			return x, nil
		case []any:
			out := make([]string, 0, len(x))
			for i, e := range x {
				s, ok := e.(string)
				if !ok {
					return nil, fmt.Errorf("element %d: want a string, got %s", i, describe(e))
				}
				out = append(out, s)
			}
			return out, nil
		}
		return nil, fmt.Errorf("want a list of strings, got %s", describe(v))
	}
	return nil, fmt.Errorf("unsupported key type")
}

func splitList(s string) []string {
	var out []string
	for part := range strings.SplitSeq(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}

func describe(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case map[string]any:
		return "a mapping"
	case []any:
		return "a list"
	}
	return fmt.Sprintf("%T %v", v, v)
}

// validationErrors turns Config.Validate's joined "key: message" errors
// into KeyErrors that also say which source set the key, in the order of
// the C5 table.
func validationErrors(err error, origin map[string]string) error {
	type item struct {
		err error
		pos int // of the key in the C5 table; unknown names last
	}
	var items []item
	for _, e := range flatJoin(err) {
		name, msg, ok := strings.Cut(e.Error(), ": ")
		pos := slices.IndexFunc(keys, func(k Key) bool { return k.Name == name })
		if !ok || pos < 0 {
			items = append(items, item{e, len(keys)})
			continue
		}
		items = append(items, item{&KeyError{Key: name, Source: origin[name], Err: errors.New(msg)}, pos})
	}
	slices.SortStableFunc(items, func(a, b item) int { return a.pos - b.pos })
	out := make([]error, len(items))
	for i, it := range items {
		out[i] = it.err
	}
	return errors.Join(out...)
}

// flatJoin returns the leaves of nested errors.Join errors.
func flatJoin(err error) []error {
	j, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return []error{err}
	}
	var out []error
	for _, e := range j.Unwrap() {
		out = append(out, flatJoin(e)...)
	}
	return out
}
