package config

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

const configFlag = "config"

// RegisterFlags adds --config and one flag per C5 key to fs. The flags keep
// their raw text: Load converts and checks it, so a bad value is reported with
// its key name like every other configuration error. Help texts show the
// defaults of DefaultConfig.
func RegisterFlags(fs *pflag.FlagSet) {
	fs.String(configFlag, "", "YAML configuration file (keys nested as in lock: session: ttl: 15s)")
	def := DefaultConfig()
	for i := range keys {
		key := &keys[i]
		v := &rawValue{kind: key.kind}
		f := fs.VarPF(v, key.Flag, "", key.Usage+" ["+key.Env+"]")
		f.DefValue = formatDefault(key.get(&def))
		if key.kind == kindBool {
			f.NoOptDefVal = "true"
		}
	}
}

func formatDefault(v any) string {
	switch x := v.(type) {
	case []string:
		return strings.Join(x, ",")
	case bool:
		if !x {
			return "" // pflag omits empty defaults from help
		}
	case time.Duration:
		if x == 0 {
			return ""
		}
	}
	return fmt.Sprint(v)
}

// rawValue is a pflag.Value that stores the text it was given. A list flag
// given more than once accumulates its values, comma-separated.
type rawValue struct {
	kind kind
	s    string
	set  bool
}

func (v *rawValue) String() string { return v.s }

func (v *rawValue) Set(s string) error {
	if v.kind == kindList && v.set {
		v.s += "," + s
	} else {
		v.s = s
	}
	v.set = true
	return nil
}

func (v *rawValue) Type() string { return kindTypes[v.kind] }
