package registry

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/random"
)

func TestCheck(t *testing.T) {
	s := newScenario(t)
	p := s.pusher()
	plan, err := p.Plan(context.Background(), s.imgs)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Push(context.Background(), plan); err != nil {
		t.Fatal(err)
	}
	if err := p.Check(context.Background(), s.imgs); err != nil {
		t.Fatalf("after a complete push: %v", err)
	}

	t.Run("a tag points elsewhere", func(t *testing.T) {
		other, err := random.Image(100, 1)
		if err != nil {
			t.Fatal(err)
		}
		s.tr.write(t, "lib/b:v1", other)
		t.Cleanup(func() { s.tr.write(t, "lib/b:v1", layered(t, s.l[0], s.l[3])) })
		err = p.Check(context.Background(), s.imgs)
		if err == nil || !strings.Contains(err.Error(), s.tr.host+"/lib/b:v1") || !strings.Contains(err.Error(), s.imgs[2].Root().Digest.String()) {
			t.Fatalf("err %v; want lib/b:v1 named with the digest it should have", err)
		}
		for _, fine := range []string{"lib/a:v1", "lib/c:v1", "lib/a:base"} {
			if strings.Contains(err.Error(), fine) {
				t.Errorf("%s is fine but named: %v", fine, err)
			}
		}
	})
	t.Run("an image is missing", func(t *testing.T) {
		img, err := random.Image(100, 1)
		if err != nil {
			t.Fatal(err)
		}
		missing := newMemSource().image(t, img, s.tr.ref(t, "lib/never:v1"), false)
		err = p.Check(context.Background(), append([]*PushImage{missing}, s.imgs[1:]...))
		if err == nil || !strings.Contains(err.Error(), s.tr.host+"/lib/never:v1") {
			t.Errorf("err %v; want lib/never:v1 named", err)
		}
	})
	t.Run("cut short", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		err := p.Check(ctx, s.imgs)
		if err == nil {
			t.Fatal("a check that did not run passed")
		}
		for _, im := range s.imgs {
			if !strings.Contains(err.Error(), im.Target.String()) {
				t.Errorf("%s unchecked but not named: %v", im.Target, err)
			}
		}
	})
}
