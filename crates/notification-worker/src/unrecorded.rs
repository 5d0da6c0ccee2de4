//! What this worker published whose inbox record failed, remembered so that the message,
//! handled again, is only recorded, not published again.

use std::collections::HashMap;
use std::time::Duration;

use uuid::Uuid;

use crate::message::Ready;

/// The notifications this worker published whose inbox record failed (the database down
/// between the publish and its record). The message is held through the outage and handled
/// again; the notification is then not published again, only recorded: SPEC §1.4 allows a
/// repeat only after a crash or a lost answer. Forgotten once recorded, or after
/// [`Unrecorded::KEPT`] (by then the message has come back to some worker, which publishes
/// it as after a crash).
#[derive(Debug, Default)]
pub(crate) struct Unrecorded(std::sync::Mutex<HashMap<Uuid, std::time::Instant>>);

impl Unrecorded {
    const KEPT: Duration = Duration::from_secs(12 * 3600);

    pub(crate) fn remember(&self, ids: &[Uuid]) {
        let mut unrecorded = self.0.lock().expect("not poisoned");
        unrecorded.retain(|_, at| at.elapsed() < Self::KEPT);
        let now = std::time::Instant::now();
        unrecorded.extend(ids.iter().map(|id| (*id, now)));
    }

    pub(crate) fn forget(&self, ids: &[Uuid]) {
        let mut unrecorded = self.0.lock().expect("not poisoned");
        for id in ids {
            unrecorded.remove(id);
        }
    }

    /// Splits `ready` into the notifications published here and not yet recorded, and the rest.
    pub(crate) fn split(&self, ready: Vec<Ready>) -> (Vec<Ready>, Vec<Ready>) {
        let unrecorded = self.0.lock().expect("not poisoned");
        ready.into_iter().partition(|r| unrecorded.contains_key(&r.message_id))
    }
}
