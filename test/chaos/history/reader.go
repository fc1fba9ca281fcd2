package history

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// File is one history file as read: its process, the run epoch it was
// written against (Unix nanoseconds) and its operations.
type File struct {
	Proc  string
	Epoch int64
	// Start is the run time the recorder started.
	Start int64
	Ops   []Op
}

// Read reads one history file. An operation invoked but never completed gets
// Outcome Unknown and Complete Never. A final line cut short (the process was
// killed while writing it) is ignored; any other malformed line is an error.
func Read(r io.Reader) (File, error) {
	var f File
	br := bufio.NewReader(r)
	pending := map[uint64]int{} // seq → index in f.Ops of an invoke without completion
	for n := 1; ; n++ {
		b, err := br.ReadBytes('\n')
		if errors.Is(err, io.EOF) {
			// Bytes after the last newline are a line torn by a kill
			// mid-write (the recorder ends every line with one): ignore.
			break
		}
		if err != nil {
			return File{}, fmt.Errorf("history: read line %d: %w", n, err)
		}
		if len(bytes.TrimSpace(b)) == 0 {
			continue
		}
		var l line
		if err := json.Unmarshal(b, &l); err != nil {
			return File{}, fmt.Errorf("history: decode line %d: %w", n, err)
		}
		if n == 1 {
			if l.Ev != lineStart || l.Proc == "" {
				return File{}, fmt.Errorf("history: line 1: want a start line with a process id, got %q", b)
			}
			f.Proc, f.Epoch, f.Start = l.Proc, l.Epoch, l.Invoke
			continue
		}
		switch l.Ev {
		case lineInvoke:
			if _, dup := pending[l.Seq]; dup {
				return File{}, fmt.Errorf("history: line %d: seq %d invoked twice", n, l.Seq)
			}
			op := l.Op
			op.Complete, op.Outcome = Never, Unknown
			pending[l.Seq] = len(f.Ops)
			f.Ops = append(f.Ops, op)
		case lineComplete:
			i, ok := pending[l.Seq]
			if !ok {
				return File{}, fmt.Errorf("history: line %d: completion of seq %d, which is not in flight", n, l.Seq)
			}
			delete(pending, l.Seq)
			op := &f.Ops[i]
			op.Complete, op.Outcome, op.Err = l.Complete, l.Outcome, l.Err
			if l.Token != 0 {
				op.Token = l.Token
			}
		case lineOp:
			f.Ops = append(f.Ops, l.Op)
		default:
			return File{}, fmt.Errorf("history: line %d: unknown line kind %q", n, l.Ev)
		}
	}
	if f.Proc == "" {
		return File{}, errors.New("history: read: empty file (no start line)")
	}
	return f, nil
}

// ReadFiles reads and merges the history files of one run into a sorted,
// validated History. It is an error if the files disagree on the epoch or two
// files belong to the same process id (package doc, Files).
func ReadFiles(paths ...string) (History, error) {
	var h History
	procs := map[string]string{}
	var epoch int64
	for i, p := range paths {
		f, err := readPath(p)
		if err != nil {
			return nil, err
		}
		if other, dup := procs[f.Proc]; dup {
			return nil, fmt.Errorf("history: %s and %s both record process %q", other, p, f.Proc)
		}
		procs[f.Proc] = p
		if i == 0 {
			epoch = f.Epoch
		} else if f.Epoch != epoch {
			return nil, fmt.Errorf("history: %s has epoch %d, %s has %d: not one run", p, f.Epoch, paths[0], epoch)
		}
		h = append(h, f.Ops...)
	}
	h.Sort()
	if err := h.Validate(); err != nil {
		return nil, err
	}
	return h, nil
}

// ReadDir is ReadFiles of every file in dir matching pattern (filepath.Match
// syntax, e.g. "*.jsonl").
func ReadDir(dir, pattern string) (History, error) {
	paths, err := filepath.Glob(filepath.Join(dir, pattern))
	if err != nil {
		return nil, fmt.Errorf("history: read dir: %w", err)
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("history: read dir: no file matches %s", filepath.Join(dir, pattern))
	}
	return ReadFiles(paths...)
}

func readPath(p string) (File, error) {
	fh, err := os.Open(p)
	if err != nil {
		return File{}, fmt.Errorf("history: open: %w", err)
	}
	defer fh.Close()
	f, err := Read(fh)
	if err != nil {
		return File{}, fmt.Errorf("%s: %w", p, err)
	}
	return f, nil
}
