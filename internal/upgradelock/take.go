package upgradelock

import (
	"context"
	"log/slog"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"
)

// Take acquires the lock (Acquire), holds it (Hold: ctx ends if it is
// lost), and runs then, where given, once it is held, with the holder
// whose lock it took over ("" for none): the run's first act as the only
// holder (agent mode takes over what that stopped run left). stop
// releases the hold; on an error nothing is held.
func Take(ctx context.Context, c kubernetes.Interface, holder string, duration time.Duration, clk clock.Clock, log *slog.Logger,
	then func(ctx context.Context, takenOver string) error) (_ *Lock, _ context.Context, stop func(), err error) {
	lock, err := Acquire(ctx, c, holder, duration, clk, log)
	if err != nil {
		return nil, ctx, nil, err
	}
	if lock.TakenOver != "" {
		log.Warn("took over the lock of a run that stopped", "holder", lock.TakenOver)
	}
	ctx, stop = Hold(ctx, lock, log)
	if then != nil {
		if err := then(ctx, lock.TakenOver); err != nil {
			stop()
			return nil, ctx, nil, err
		}
	}
	return lock, ctx, stop, nil
}
