//! One request at a time on each PaymentIntent, within a process.
//!
//! Stripe locks an object while a request changes it; another request on the same object waits
//! for the lock and, if it waits too long, is answered `429 lock_timeout`. Stripe's advice is
//! to retry it, and to send one object's requests one after another rather than at once
//! (docs.stripe.com/rate-limits#object-lock-timeouts). A process can race itself on one intent:
//! the stock worker's capture and the sweeper's or a webhook's cancel, a redelivered message
//! beside the first. [`OneAtATime`] gives each intent a turn: a change to an intent waits here
//! for the one before it, retries included, to end.
//!
//! A turn is an async mutex per intent id, made on first use and forgotten when its last
//! holder or waiter lets go, so the map holds only the intents being changed now.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::OwnedMutexGuard;

/// The turns of the intents this process is changing now. Clones of the client share one.
#[derive(Debug, Default)]
pub(super) struct OneAtATime {
    turns: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// The turn on one intent: no other request of this process changes it until this is dropped.
pub(super) struct Turn<'a> {
    held: Option<OwnedMutexGuard<()>>,
    turn: Arc<tokio::sync::Mutex<()>>,
    payment_intent_id: String,
    of: &'a OneAtATime,
}

impl OneAtATime {
    /// Waits for `payment_intent_id`'s turn.
    pub(super) async fn turn(&self, payment_intent_id: &str) -> Turn<'_> {
        let turn = {
            let mut turns = self.turns.lock().unwrap_or_else(PoisonError::into_inner);
            // A waiter cancelled before its turn came (a deadline, a client gone) leaves its
            // intent's entry behind with no one holding or awaiting it: forgotten here.
            turns.retain(|_, turn| Arc::strong_count(turn) > 1);
            Arc::clone(turns.entry(payment_intent_id.to_owned()).or_default())
        };
        let held = Arc::clone(&turn).lock_owned().await;
        Turn { held: Some(held), turn, payment_intent_id: payment_intent_id.to_owned(), of: self }
    }

    /// How many intents have a turn in use or awaited.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.turns.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        // The next waiter goes on first; then, under the map's lock (where every other holder
        // took its clone), the turn is forgotten if no one else holds or awaits it: the map's
        // clone and this one are all that are left.
        drop(self.held.take());
        let mut turns = self.of.turns.lock().unwrap_or_else(PoisonError::into_inner);
        if Arc::strong_count(&self.turn) == 2 {
            turns.remove(&self.payment_intent_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn requests_on_one_intent_go_one_at_a_time_and_others_do_not_wait() {
        let turns = Arc::new(OneAtATime::default());
        let first = turns.turn("pi_1").await;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let waiter = tokio::spawn({
            let turns = Arc::clone(&turns);
            async move {
                let _turn = turns.turn("pi_1").await;
                tx.send(()).unwrap();
            }
        });
        // Another intent is not held up by pi_1's turn.
        drop(turns.turn("pi_2").await);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(rx.try_recv().is_err(), "the second request on pi_1 went while the first held it");

        drop(first);
        waiter.await.unwrap();
        assert_eq!(rx.recv().await, Some(()));
        assert_eq!(turns.len(), 0, "a turn no one holds or awaits is forgotten");
    }
}
