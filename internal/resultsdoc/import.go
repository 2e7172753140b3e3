package resultsdoc

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

var (
	// The first lines of the lab's results.md (loadtest.writeMarkdown).
	commandLine = regexp.MustCompile("(?m)^`([^`]+)`, [^,]+, (\\S+) wall time\\.$")
	machineLine = regexp.MustCompile(`(?m)^Machine: (.+)\.$`)
	// --out and --orderd name paths of the machine the lab ran on.
	outFlag = regexp.MustCompile(`\s--(out|orderd)[ =]\S+`)
)

// Import stores the runs of the lab report folders in spec ("NAME=DIR,DIR")
// as dir/NAME.json, one list, and replaces NAME's entries in labs.json with
// each folder's command, machine and wall time.
func Import(dir, spec string) error {
	name, folders, ok := strings.Cut(spec, "=")
	if !ok || name == "" || folders == "" {
		return fmt.Errorf("-import %q: want NAME=DIR[,DIR...]", spec)
	}
	var all []json.RawMessage
	var labs []Lab
	for _, folder := range strings.Split(folders, ",") {
		b, err := os.ReadFile(filepath.Join(folder, "results.json"))
		if err != nil {
			return err
		}
		var runs []json.RawMessage
		if err := json.Unmarshal(b, &runs); err != nil {
			return fmt.Errorf("%s: %w", folder, err)
		}
		all = append(all, runs...)
		md, err := os.ReadFile(filepath.Join(folder, "results.md"))
		if err != nil {
			return err
		}
		lab, err := parseHeader(string(md))
		if err != nil {
			return fmt.Errorf("%s/results.md: %w", folder, err)
		}
		lab.Name = name
		labs = append(labs, lab)
	}
	var out bytes.Buffer
	out.WriteString("[\n")
	for i, r := range all {
		var line bytes.Buffer
		if err := json.Compact(&line, r); err != nil {
			return err
		}
		out.Write(line.Bytes())
		if i < len(all)-1 {
			out.WriteString(",")
		}
		out.WriteString("\n")
	}
	out.WriteString("]\n")
	if err := os.WriteFile(filepath.Join(dir, name+".json"), out.Bytes(), 0o644); err != nil {
		return err
	}

	var existing []Lab
	if b, err := os.ReadFile(filepath.Join(dir, LabsFile)); err == nil {
		if err := json.Unmarshal(b, &existing); err != nil {
			return fmt.Errorf("%s: %w", LabsFile, err)
		}
	}
	existing = slices.DeleteFunc(existing, func(l Lab) bool { return l.Name == name })
	existing = append(existing, labs...)
	b, err := json.MarshalIndent(existing, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, LabsFile), append(b, '\n'), 0o644)
}

// parseHeader reads the command, wall time and machine from results.md;
// the command loses its --out and --orderd (paths of the machine it ran on).
func parseHeader(md string) (Lab, error) {
	c := commandLine.FindStringSubmatch(md)
	m := machineLine.FindStringSubmatch(md)
	if c == nil || m == nil {
		return Lab{}, fmt.Errorf("no command line or machine line")
	}
	cmd := outFlag.ReplaceAllString(c[1], "")
	cmd = "go run ./cmd/" + cmd
	return Lab{Command: cmd, Wall: c[2], Machine: m[1]}, nil
}
