package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode"

	"github.com/kubelift/kubelift/internal/cli"
	"github.com/kubelift/kubelift/internal/inplace/record"
	"github.com/kubelift/kubelift/internal/runwatch"
)

// errUpgradeEnded: the watched upgrade ended other than complete.
var errUpgradeEnded = errors.New("the upgrade did not complete")

// watchRun is status --watch: the upgrade's changes as they happen, and
// its outcome as the exit code.
func watchRun(ctx context.Context, opts *statusOptions, asJSON bool) error {
	if opts.Timeout < 0 {
		return cli.Usagef("--timeout %s: want a duration, 0 for none", opts.Timeout)
	}
	client, err := opts.KubeClient()
	if err != nil {
		return err
	}
	if opts.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, opts.Timeout)
		defer cancel()
	}
	set, finish := opts.IO.Counter(opts.Quiet || asJSON, "nodes")
	enc := json.NewEncoder(opts.IO.Out)
	u, err := runwatch.Follow(ctx, client, runwatch.Options{To: opts.To}, func(ch runwatch.Change) {
		if asJSON {
			_ = enc.Encode(ch)
		} else {
			printChange(opts.IO.Out, cleanChange(ch))
		}
		set(ch.Done, ch.Total)
	})
	finish()
	switch {
	case errors.Is(err, context.DeadlineExceeded) && u != nil:
		return fmt.Errorf("--timeout %s: the upgrade %s -> %s is still %s", opts.Timeout, u.From, u.To, u.State)
	case err != nil:
		return err
	case u.State == record.StateComplete:
		return nil
	case u.LastError != "":
		return fmt.Errorf("upgrade %s -> %s: %w: %s: %s", u.From, u.To, errUpgradeEnded, u.State, u.LastError)
	}
	return fmt.Errorf("upgrade %s -> %s: %w: %s", u.From, u.To, errUpgradeEnded, u.State)
}

// printChange prints a change as a line.
func printChange(w io.Writer, ch runwatch.Change) {
	at := ch.At.UTC().Format(time.TimeOnly)
	switch ch.Kind {
	case runwatch.KindState:
		line := fmt.Sprintf("%s  upgrade %s -> %s: %s (%d/%d nodes)", at, ch.From, ch.To, ch.State, ch.Done, ch.Total)
		if ch.Message != "" {
			line += ": " + ch.Message
		}
		fmt.Fprintln(w, line)
	case runwatch.KindStep:
		fmt.Fprintf(w, "%s  %s: %s\n", at, ch.Node, ch.Step)
	case runwatch.KindNode:
		line := fmt.Sprintf("%s  %s: %s", at, ch.Node, ch.Status)
		if ch.Message != "" {
			line += ": " + ch.Message
		}
		fmt.Fprintln(w, line)
	case runwatch.KindEvent:
		fmt.Fprintf(w, "%s  %s: event %s: %s\n", at, ch.Node, ch.Reason, ch.Message)
	}
}

// cleanChange makes what the cluster said printable on a terminal:
// control characters (an escape sequence in an Event's message) become
// '?'.
func cleanChange(ch runwatch.Change) runwatch.Change {
	clean := func(s string) string {
		return strings.Map(func(r rune) rune {
			if unicode.IsControl(r) {
				return '?'
			}
			return r
		}, s)
	}
	ch.Node, ch.Step, ch.Status, ch.State, ch.Reason, ch.Message = clean(ch.Node), clean(ch.Step), clean(ch.Status), clean(ch.State), clean(ch.Reason), clean(ch.Message)
	ch.From, ch.To = clean(ch.From), clean(ch.To)
	return ch
}
