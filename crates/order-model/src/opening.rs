//! The opening (SPEC §1.8, §8.12), model-checked: a product that opens at a set time, with a
//! pre-queue before it, the draw that puts the queue in line, units going down that line as
//! they come back, and the door after the opening.
//!
//! The main model ([`crate::model`]) is about one order's payment and its failures; this one is
//! about the line a queue makes, so its payment is short (a card authorizes, declines, or
//! needs its buyer's 3-D Secure, which the buyer completes or abandons) and its steps are the
//! statements the opening is made of:
//!
//! - [`Step::Enter`]: an early buyer's order at the door in the queue window, written `queued`
//!   with no unit and no place (`door.sql`'s `queued`);
//! - [`Step::Begin`], [`Step::Commit`], [`Step::Die`]: a stock worker's opener calling
//!   `open_product` (`opener.rs`, `Product::open`): the compare-and-set on `opened_at` takes the
//!   product's row lock, the draw places the queue in any order, and `promote_queued` promises
//!   units down the line, all in one transaction that a killed process rolls back;
//! - [`Step::Door`]: a buyer after the opening (`door.sql`'s `promised`), who hears `not_open`
//!   before the opening is done, and `sold_out` while a queued order waits;
//! - [`Step::Authorize`], [`Step::Authenticate`], [`Step::Capture`]: the fleet authorizing a
//!   promised order without its buyer (`promoted.rs`), the buyer's 3-D Secure, the capture; a
//!   decline or an abandoned authentication gives the units back, and a capture may be the last
//!   holder's, and each runs `promote_queued` in its own transaction (the triggers
//!   `orders_units_freed`, `products_units_back`).
//!
//! - [`Step::Pause`], [`Step::Resume`]: the operator's pause (`pause.rs`): the door refuses
//!   (`sale_paused`), `promote_queued` and `open_product` do nothing while it lasts, and the
//!   resume serves the queue (`products_resumed`) and wakes the openers.
//!
//! [`OpeningRules`] has the code's rules and four defects planted to show the checker finds
//! them: an opening two processes can both take, a door that ignores the queue, a pause that
//! stops the door alone, and a queue entry blind to the pause.

// The state's fields are named after the columns they model, which each type's doc names.
#![allow(missing_docs)]

use std::fmt::Write;

use stateright::{Checker, HasDiscoveries, Model, Property};

use crate::state::{Card, Lifecycle, Status, StatusSet};

/// When a scenario's buyer comes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Comes {
    /// In the pre-queue window: the order is queued.
    Early,
    /// After `opens_at`: the door, once the opening is done. The number is how many times the
    /// buyer asks (a `not_open` or `sold_out` answer writes nothing, and they may ask again).
    Late(u8),
}

/// What is checked: the product's units, its buyers, and the processes that may open it.
#[derive(Clone, Debug)]
pub struct OpeningScenario {
    /// The scenario's name.
    pub name: &'static str,
    /// The product's total units.
    pub total: u8,
    /// Each buyer: the units asked for, the card, and when they come.
    pub buyers: Vec<(u8, Card, Comes)>,
    /// The stock workers whose openers may open the product.
    pub openers: u8,
    /// How many times an opener may be killed in the middle of the opening.
    pub kills: u8,
    /// How many times the operator may pause the sale (each pause resumed at any moment after).
    pub pauses: u8,
}

/// The code's way, and a defect planted on purpose, for each decision of the opening.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpeningRules {
    /// How a process takes the opening.
    pub opening: TakeRule,
    /// What the door counts before promising an order made after the opening.
    pub door: DoorRule,
    /// Whether the queue is served while the product is paused.
    pub pause: PauseRule,
}

impl OpeningRules {
    /// The code's rules.
    pub const NOW: OpeningRules = OpeningRules {
        opening: TakeRule::CompareAndSet,
        door: DoorRule::QueueFirst,
        pause: PauseRule::ServedAtTheResume,
    };
}

/// What `promote_queued` does while the product is paused (`fleetctl product pause`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PauseRule {
    /// The code: nothing; the resume serves the queue (the trigger `products_resumed`).
    ServedAtTheResume,
    /// Planted to show the checker finds it: the pause stops the door alone, and a unit that
    /// comes back while paused is promised to the queue.
    ServedWhilePaused,
    /// Planted to show the checker finds it: the door's queue entry does not read the pause,
    /// and takes entries while the product is paused.
    EntriesWhilePaused,
}

/// How an opener takes the opening (`open_product`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TakeRule {
    /// The code: `UPDATE products SET opened_at = now() … WHERE opened_at IS NULL`, in the
    /// transaction that draws and promises: one caller's update locks the row, another's waits
    /// for it and, once it commits, finds `opened_at` set and does nothing.
    CompareAndSet,
    /// Planted to show the checker finds it: the opener reads that the product is not opened,
    /// then draws and writes without a condition, so two processes that read before either
    /// wrote both draw.
    ReadThenWrite,
}

/// What the door counts before promising units to an order made after the opening
/// (`door.sql`'s `promised`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DoorRule {
    /// The code: nothing is promised while a queued order waits (`NOT queue_waiting`), so the
    /// units the queue wants are not given to a later order.
    QueueFirst,
    /// Planted to show the checker finds it: the door counts only the units left.
    IgnoresTheQueue,
}

/// An opener's progress through the opening.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Opener {
    /// Not opening.
    Idle,
    /// Inside the opening's transaction: under [`TakeRule::CompareAndSet`] holding the
    /// product's row lock; under [`TakeRule::ReadThenWrite`] having read it unopened.
    Opening,
}

/// An order row: its status, its place once it has one, and what the properties remember.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Order {
    pub status: Status,
    /// Its place in line: none while queued before the draw.
    pub position: Option<u8>,
    /// It holds a PaymentIntent (made by its authorization).
    pub intent: bool,
    /// It was queued (made in the pre-queue window).
    pub queued: bool,
    /// When it was promised its units, an order ahead of it in line was queued, waiting.
    pub passed_the_queue: bool,
}

/// The state: the product, the clock, the orders, the openers.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct OpeningState {
    /// `opens_at` has passed (before it, the pre-queue window is open).
    pub due: bool,
    /// `opened_at` is set.
    pub opened: bool,
    /// How many times the queue was drawn.
    pub draws: u8,
    pub total: u8,
    pub promised: u8,
    pub last_position: u8,
    /// `queue_waiting`: a drawn queued order waits for units.
    pub queue_waiting: bool,
    /// Each buyer's one order, if made.
    pub orders: Vec<Option<Order>>,
    /// Each buyer's asks left (a late buyer's).
    pub asks_left: Vec<u8>,
    pub openers: Vec<Opener>,
    pub kills_left: u8,
    /// `paused_at` is set.
    pub paused: bool,
    pub pauses_left: u8,
    /// A unit was promised, or a queue entry taken, while the product was paused.
    pub promised_while_paused: bool,
}

/// One step of one actor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// `opens_at` passes.
    OpensAtPasses,
    /// An early buyer's order, queued.
    Enter(u8),
    /// An opener begins the opening.
    Begin(u8),
    /// An opener draws the queue in the order given (the `n`th permutation of the queued orders,
    /// by buyer) and promises units down the line, and commits.
    Commit(u8, u8),
    /// An opener is killed inside the opening: its transaction rolls back.
    Die(u8),
    /// A late buyer asks at the door.
    Door(u8),
    /// The fleet authorizes a promised order with its card.
    Authorize(u8),
    /// A buyer completes (`true`) or abandons their 3-D Secure.
    Authenticate(u8, bool),
    /// An authorized order is captured.
    Capture(u8),
    /// The operator pauses the sale.
    Pause,
    /// The operator resumes it.
    Resume,
}

/// The opening as a Stateright model: a scenario under a set of rules.
#[derive(Clone, Debug)]
pub struct OpeningProtocol {
    pub scenario: OpeningScenario,
    pub rules: OpeningRules,
}

/// The property a second draw breaks.
pub const DRAWN_ONCE: &str = "§8.12 the queue is drawn once, whatever the number of processes";
/// The property a promise before the opening breaks.
pub const NOTHING_BEFORE_THE_OPENING: &str = "§8.12 no unit is promised before the opening";
/// The property an opening that never happens breaks.
pub const IT_OPENS: &str = "§8.12 the product opens, a killed opener's opening done by another (at the end)";
/// The property an intent on a queued order breaks.
pub const NO_INTENT_WHILE_QUEUED: &str = "§8.8 a queued order holds no PaymentIntent";
/// The property a later order placed ahead of the queue breaks.
pub const QUEUE_AHEAD: &str = "§8.7 the queue is ahead of every order made after the opening";
/// The property an order promised past a waiting queued order breaks.
pub const DOWN_THE_LINE: &str = "§8.7 no order is promised units while a queued order ahead of it waits";
/// The property a wrong `sold_out` breaks.
pub const SOLD_OUT_IN_LINE: &str =
    "§8.7 a queued order ends sold_out only when the units went to orders ahead (at the end)";
/// The property a queued order left waiting breaks.
pub const NOTHING_LEFT_QUEUED: &str = "§5 nothing is left queued, and every order ends (at the end)";
/// The property a promise during a pause breaks.
pub const NOTHING_WHILE_PAUSED: &str =
    "§8.12 no unit is promised, and no queue entry taken, while the product is paused";
/// The property a miscount breaks.
pub const UNITS: &str = "§8.3 units promised never exceed the total, and add up to the orders holding them";

impl OpeningProtocol {
    /// Whether nothing can happen any more.
    pub fn is_final(&self, s: &OpeningState) -> bool {
        let mut next = Vec::new();
        self.actions(s, &mut next);
        next.is_empty()
    }

    fn quantity(&self, buyer: usize) -> u8 {
        self.scenario.buyers[buyer].0
    }

    /// `promote_queued`: the queued orders in line order; each whose units are left is
    /// promised them; the first that does not fit stops the line while an order holding units
    /// may give them back, and otherwise ends `sold_out`, its units going on down the line.
    fn promote(&self, s: &mut OpeningState) {
        let paused = s.paused && self.rules.pause != PauseRule::ServedWhilePaused;
        if !s.opened || !s.queue_waiting || paused {
            return;
        }
        let mut line: Vec<usize> = (0..s.orders.len())
            .filter(|&b| s.orders[b].is_some_and(|o| o.status == Status::Queued))
            .collect();
        line.sort_by_key(|&b| s.orders[b].and_then(|o| o.position));
        for b in line {
            let q = self.quantity(b);
            if s.total - s.promised >= q {
                self.promise(s, b);
            } else if s.orders.iter().flatten().any(|o| o.status.set() == StatusSet::HoldsUnits) {
                break;
            } else if let Some(o) = s.orders[b].as_mut() {
                o.status = Status::SoldOut;
            }
        }
        s.queue_waiting = s.orders.iter().flatten().any(|o| o.status == Status::Queued);
    }

    /// Promises an order its units, remembering whether a queued order ahead of it waited.
    fn promise(&self, s: &mut OpeningState, b: usize) {
        let position = s.orders[b].and_then(|o| o.position);
        let waiting_ahead = s.orders.iter().enumerate().any(|(other, o)| {
            other != b
                && o.is_some_and(|o| {
                    o.status == Status::Queued && (position.is_none() || o.position < position)
                })
        });
        s.promised += self.quantity(b);
        s.promised_while_paused |= s.paused;
        if let Some(o) = s.orders[b].as_mut() {
            o.status = Status::PendingAuthorization;
            o.passed_the_queue |= waiting_ahead;
        }
    }

    /// The draw: the queued orders, by buyer, in the `n`th of their orders (permutations),
    /// placed after the product's last place.
    fn draw(s: &mut OpeningState, n: u8) {
        let mut queued: Vec<usize> = (0..s.orders.len())
            .filter(|&b| s.orders[b].is_some_and(|o| o.status == Status::Queued))
            .collect();
        let mut n = usize::from(n);
        let mut line = Vec::new();
        while !queued.is_empty() {
            let pick = n % queued.len();
            n /= queued.len();
            line.push(queued.remove(pick));
        }
        for (place, &b) in line.iter().enumerate() {
            if let Some(o) = s.orders[b].as_mut() {
                o.position = Some(s.last_position + 1 + place as u8);
            }
        }
        s.last_position += line.len() as u8;
        s.draws += 1;
        s.opened = true;
        s.queue_waiting = !line.is_empty();
    }

    /// The units an order ending gives back, and the queue served in the same transaction.
    fn give_back(&self, s: &mut OpeningState, b: usize) {
        s.promised -= self.quantity(b);
        self.promote(s);
    }

    fn queued_count(s: &OpeningState) -> usize {
        s.orders.iter().flatten().filter(|o| o.status == Status::Queued).count()
    }
}

fn factorial(n: usize) -> u8 {
    (1..=n).product::<usize>() as u8
}

impl Model for OpeningProtocol {
    type State = OpeningState;
    type Action = Step;

    fn init_states(&self) -> Vec<OpeningState> {
        let n = self.scenario.buyers.len();
        vec![OpeningState {
            due: false,
            opened: false,
            draws: 0,
            total: self.scenario.total,
            promised: 0,
            last_position: 0,
            queue_waiting: false,
            orders: vec![None; n],
            asks_left: self
                .scenario
                .buyers
                .iter()
                .map(|(_, _, comes)| match comes {
                    Comes::Early => 1,
                    Comes::Late(asks) => *asks,
                })
                .collect(),
            openers: vec![Opener::Idle; usize::from(self.scenario.openers)],
            kills_left: self.scenario.kills,
            paused: false,
            pauses_left: self.scenario.pauses,
            promised_while_paused: false,
        }]
    }

    fn actions(&self, s: &OpeningState, actions: &mut Vec<Step>) {
        if !s.due {
            actions.push(Step::OpensAtPasses);
        }
        if s.paused {
            actions.push(Step::Resume);
        } else if s.pauses_left > 0 {
            actions.push(Step::Pause);
        }
        for (b, &(_, _, comes)) in self.scenario.buyers.iter().enumerate() {
            let id = b as u8;
            match (s.orders[b], comes) {
                (None, Comes::Early) if !s.due => actions.push(Step::Enter(id)),
                (None, Comes::Late(_)) if s.due && s.asks_left[b] > 0 => actions.push(Step::Door(id)),
                (Some(o), _) => match o.status {
                    Status::PendingAuthorization => actions.push(Step::Authorize(id)),
                    Status::RequiresAction => {
                        actions.push(Step::Authenticate(id, true));
                        actions.push(Step::Authenticate(id, false));
                    }
                    Status::Authorized => actions.push(Step::Capture(id)),
                    _ => {}
                },
                _ => {}
            }
        }
        let locked = s.openers.contains(&Opener::Opening);
        for (p, opener) in s.openers.iter().enumerate() {
            let id = p as u8;
            match opener {
                Opener::Idle if s.due && !s.opened => {
                    if self.rules.opening == TakeRule::ReadThenWrite || !locked {
                        actions.push(Step::Begin(id));
                    }
                }
                Opener::Idle => {}
                Opener::Opening => {
                    for n in 0..factorial(Self::queued_count(s)) {
                        actions.push(Step::Commit(id, n));
                    }
                    if s.kills_left > 0 {
                        actions.push(Step::Die(id));
                    }
                }
            }
        }
    }

    fn next_state(&self, before: &OpeningState, step: Step) -> Option<OpeningState> {
        let mut s = before.clone();
        match step {
            Step::OpensAtPasses => s.due = true,
            // The door takes no entry while paused (`sale_paused`): the buyer may come again.
            Step::Enter(_) if s.paused && self.rules.pause != PauseRule::EntriesWhilePaused => {}
            Step::Enter(b) => {
                s.promised_while_paused |= s.paused;
                s.orders[usize::from(b)] = Some(Order {
                    status: Status::Queued,
                    position: None,
                    intent: false,
                    queued: true,
                    passed_the_queue: false,
                });
            }
            Step::Begin(p) => s.openers[usize::from(p)] = Opener::Opening,
            Step::Commit(p, n) => {
                s.openers[usize::from(p)] = Opener::Idle;
                // Under the code's rule no one else can have opened it (the row lock, then the
                // compare-and-set, which a pause fails too); under the planted one nothing is
                // checked again.
                if self.rules.opening == TakeRule::ReadThenWrite || (!s.opened && !s.paused) {
                    Self::draw(&mut s, n);
                    self.promote(&mut s);
                }
            }
            Step::Die(p) => {
                s.openers[usize::from(p)] = Opener::Idle;
                s.kills_left -= 1;
            }
            Step::Door(b) => self.door(&mut s, usize::from(b)),
            Step::Pause => {
                s.paused = true;
                s.pauses_left -= 1;
            }
            Step::Resume => {
                s.paused = false;
                self.promote(&mut s);
            }
            Step::Authorize(b) => {
                let b = usize::from(b);
                let card = self.scenario.buyers[b].1;
                if let Some(o) = s.orders[b].as_mut() {
                    o.intent = true;
                    o.status = match card {
                        Card::Good => Status::Authorized,
                        Card::Declines => Status::PaymentDeclined,
                        Card::ThreeDSecure => Status::RequiresAction,
                    };
                }
                if card == Card::Declines {
                    self.give_back(&mut s, b);
                }
            }
            Step::Authenticate(b, completed) => {
                let b = usize::from(b);
                if let Some(o) = s.orders[b].as_mut() {
                    o.status = if completed { Status::Authorized } else { Status::PaymentDeclined };
                }
                if !completed {
                    self.give_back(&mut s, b);
                }
            }
            Step::Capture(b) => {
                if let Some(o) = s.orders[usize::from(b)].as_mut() {
                    o.status = Status::Paid;
                }
                // The last holder paid: no unit can come back, and the queue left ends.
                self.promote(&mut s);
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(DRAWN_ONCE, |_, s: &OpeningState| s.draws <= 1),
            Property::always(NOTHING_BEFORE_THE_OPENING, |_, s: &OpeningState| s.opened || s.promised == 0),
            Property::always(IT_OPENS, |m: &Self, s: &OpeningState| !m.is_final(s) || s.opened),
            Property::always(NO_INTENT_WHILE_QUEUED, |_, s: &OpeningState| {
                s.orders.iter().flatten().all(|o| !(o.status == Status::Queued && o.intent))
            }),
            Property::always(QUEUE_AHEAD, queue_ahead),
            Property::always(DOWN_THE_LINE, |_, s: &OpeningState| {
                s.orders.iter().flatten().all(|o| !o.passed_the_queue)
            }),
            Property::always(SOLD_OUT_IN_LINE, |m: &Self, s: &OpeningState| {
                !m.is_final(s) || sold_out_in_line(m, s)
            }),
            Property::always(NOTHING_LEFT_QUEUED, |m: &Self, s: &OpeningState| {
                !m.is_final(s) || s.orders.iter().flatten().all(|o| o.status.is_terminal())
            }),
            Property::always(NOTHING_WHILE_PAUSED, |_, s: &OpeningState| !s.promised_while_paused),
            Property::always(UNITS, units),
        ]
    }
}

impl OpeningProtocol {
    /// `door.sql`'s `promised` for an order made after `opens_at`: nothing before the opening
    /// is done (`not_open`), nothing while the queue waits (`sold_out`, under the code's rule),
    /// else the units if they are left, at the next place.
    fn door(&self, s: &mut OpeningState, b: usize) {
        s.asks_left[b] -= 1;
        let q = self.quantity(b);
        let queue_first = self.rules.door == DoorRule::QueueFirst;
        if !s.opened || s.paused || (queue_first && s.queue_waiting) || s.total - s.promised < q {
            return;
        }
        s.last_position += 1;
        s.orders[b] = Some(Order {
            status: Status::PendingAuthorization,
            position: Some(s.last_position),
            intent: false,
            queued: false,
            passed_the_queue: false,
        });
        self.promise(s, b);
    }
}

/// Every queued order that has a place is ahead of every order made after the opening.
fn queue_ahead(_: &OpeningProtocol, s: &OpeningState) -> bool {
    let placed = |queued: bool| {
        s.orders.iter().flatten().filter(move |o| o.queued == queued).filter_map(|o| o.position)
    };
    placed(true).all(|queued| placed(false).all(|later| queued < later))
}

/// At the end: each `sold_out` order asked for more units than the orders ahead of it left.
fn sold_out_in_line(m: &OpeningProtocol, s: &OpeningState) -> bool {
    s.orders.iter().enumerate().all(|(b, o)| match o {
        Some(o) if o.status == Status::SoldOut => {
            let sold_ahead: u8 = s
                .orders
                .iter()
                .enumerate()
                .filter(|(_, a)| a.is_some_and(|a| a.status == Status::Paid && a.position < o.position))
                .map(|(a, _)| m.quantity(a))
                .sum();
            s.total - sold_ahead < m.quantity(b)
        }
        _ => true,
    })
}

/// Units promised never exceed the total, and are the units of the orders that hold or sold
/// them.
fn units(m: &OpeningProtocol, s: &OpeningState) -> bool {
    let held: u8 = s
        .orders
        .iter()
        .enumerate()
        .filter(|(_, o)| o.is_some_and(|o| matches!(o.status.set(), StatusSet::HoldsUnits | StatusSet::Sold)))
        .map(|(b, _)| m.quantity(b))
        .sum();
    s.promised <= s.total && held == s.promised
}

/// The scenarios, each small, because every interleaving is visited.
pub mod scenarios {
    use super::{Comes, OpeningProtocol, OpeningRules, OpeningScenario};
    use crate::state::Card;

    /// A queue with a decline, an abandoned 3-D Secure and an order asking for more than is
    /// left, so units come back to it, and a buyer after the opening asking twice: two units.
    pub fn units_coming_back_to_the_queue() -> OpeningScenario {
        OpeningScenario {
            name: "units coming back to the queue",
            total: 2,
            buyers: vec![
                (1, Card::Declines, Comes::Early),
                (2, Card::Good, Comes::Early),
                (1, Card::ThreeDSecure, Comes::Early),
                (1, Card::Good, Comes::Late(2)),
            ],
            openers: 1,
            kills: 0,
            pauses: 0,
        }
    }

    /// The operator pausing the sale at any moment, before the opening or while the queue is
    /// served, and resuming it: a queue whose first order declines while paused.
    pub fn a_pause_at_any_moment() -> OpeningScenario {
        OpeningScenario {
            name: "a pause at any moment",
            total: 1,
            buyers: vec![
                (1, Card::Declines, Comes::Early),
                (1, Card::Good, Comes::Early),
                (1, Card::Good, Comes::Late(2)),
            ],
            openers: 1,
            kills: 0,
            pauses: 1,
        }
    }

    /// Two stock workers' openers racing for the opening, one killed inside it once; three
    /// queued buyers (one card declines, one needs 3-D Secure) for one unit, and one after who
    /// asks twice.
    pub fn two_openers_and_a_kill() -> OpeningScenario {
        OpeningScenario {
            name: "two openers and a kill",
            total: 1,
            buyers: vec![
                (1, Card::Good, Comes::Early),
                (1, Card::Declines, Comes::Early),
                (1, Card::ThreeDSecure, Comes::Early),
                (1, Card::Good, Comes::Late(2)),
            ],
            openers: 2,
            kills: 1,
            pauses: 0,
        }
    }

    /// Every scenario under the code's rules.
    pub fn models() -> Vec<OpeningProtocol> {
        [units_coming_back_to_the_queue(), two_openers_and_a_kill(), a_pause_at_any_moment()]
            .into_iter()
            .map(|scenario| OpeningProtocol { scenario, rules: OpeningRules::NOW })
            .collect()
    }
}

/// What one check of the opening visited, and each property broken with the path that broke
/// it, one step a line.
pub struct OpeningReport {
    pub name: &'static str,
    pub states: usize,
    pub counterexamples: Vec<(&'static str, String)>,
}

impl std::fmt::Display for OpeningReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {} states; ", self.name, self.states)?;
        match self.counterexamples.len() {
            0 => write!(f, "every property holds"),
            n => write!(f, "{n} propert{} broken", if n == 1 { "y" } else { "ies" }),
        }
    }
}

/// Visits every state the scenario can reach, breadth first.
pub fn check(model: OpeningProtocol) -> OpeningReport {
    let name = model.scenario.name;
    let checker = model.clone().checker().finish_when(HasDiscoveries::AllFailures).spawn_bfs().join();
    let mut counterexamples: Vec<(&'static str, String)> = checker
        .discoveries()
        .into_iter()
        .map(|(property, path)| {
            let mut told = String::new();
            for (state, step) in path.into_vec() {
                let _ = writeln!(told, "  {}", summary(&state));
                if let Some(step) = step {
                    let _ = writeln!(told, "{step:?}");
                }
            }
            (property, told)
        })
        .collect();
    counterexamples.sort_by_key(|(property, _)| *property);
    OpeningReport { name, states: checker.state_count(), counterexamples }
}

/// A state in one line: the product, then each order.
fn summary(s: &OpeningState) -> String {
    let mut line = format!(
        "opened {} draws {} total {} promised {} queue waiting {} paused {}",
        s.opened, s.draws, s.total, s.promised, s.queue_waiting, s.paused
    );
    for (b, o) in s.orders.iter().enumerate() {
        if let Some(o) = o {
            let _ = write!(line, " | {}#{:?} {:?}", ["A", "B", "C", "D", "E"][b], o.position, o.status);
        }
    }
    line
}
