package prefixstats

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxTemplates is the most templates lock.server.stats.templates may declare,
// and the most first segments the default tracks.
const MaxTemplates = 32

// MaxTemplateLen is the longest template, in bytes.
const MaxTemplateLen = 256

// Other is the template of a key no template matches.
const Other = "other"

// Any is the segment that stands for any one segment of a key.
const Any = "*"

// pattern is one declared template, split into segments.
type pattern struct {
	text string
	segs []string
}

// matches reports whether key's leading segments match p's segments. It
// allocates nothing.
func (p pattern) matches(key string) bool {
	rest := key
	for i, seg := range p.segs {
		if i > 0 {
			slash := strings.IndexByte(rest, '/')
			if slash < 0 {
				return false // the key has fewer segments
			}
			rest = rest[slash+1:]
		}
		part := rest
		if slash := strings.IndexByte(rest, '/'); slash >= 0 {
			part = rest[:slash]
		}
		if seg != Any && seg != part {
			return false
		}
		if seg == Any && part == "" {
			return false
		}
	}
	return true
}

// Validate checks the templates of lock.server.stats.templates (C5
// #ct5-stats): at most MaxTemplates, each well-formed, none repeated, none
// named Other. Every problem is reported.
func Validate(templates []string) error {
	_, err := compile(templates)
	return err
}

// compile validates and splits templates.
func compile(templates []string) ([]pattern, error) {
	var errs []error
	if len(templates) > MaxTemplates {
		errs = append(errs, fmt.Errorf("%d templates; at most %d (C4 #ct4-template-stats: %d label values × %d series = %d series)",
			len(templates), MaxTemplates, MaxTemplates+1, SeriesPerTemplate, MaxSeries))
	}
	seen := make(map[string]bool, len(templates))
	out := make([]pattern, 0, len(templates))
	for _, t := range templates {
		if err := checkTemplate(t); err != nil {
			errs = append(errs, fmt.Errorf("template %q: %w", t, err))
			continue
		}
		if seen[t] {
			errs = append(errs, fmt.Errorf("template %q is listed twice", t))
			continue
		}
		seen[t] = true
		out = append(out, pattern{text: t, segs: strings.Split(t, "/")})
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// checkTemplate checks one template's form.
func checkTemplate(t string) error {
	switch {
	case t == "":
		return errors.New("empty")
	case len(t) > MaxTemplateLen:
		return fmt.Errorf("%d bytes; at most %d", len(t), MaxTemplateLen)
	case !utf8.ValidString(t):
		return errors.New("not valid UTF-8")
	case t == Other:
		return fmt.Errorf("%q is reserved for keys no template matches", Other)
	}
	for _, seg := range strings.Split(t, "/") {
		switch {
		case seg == "":
			return errors.New("empty segment (a leading, trailing or doubled /)")
		case seg != Any && strings.Contains(seg, Any):
			return fmt.Errorf("segment %q: * stands for a whole segment only", seg)
		}
	}
	return nil
}
