//! Deficit round robin between tenants ([`super`]'s "whom it serves next"), and a claim
//! round's plan: the free slots shared out as claims one at a time would share them, so a
//! worker can claim each tenant's share in one store call.

use std::collections::{HashMap, HashSet, VecDeque};

use keel_core::TenantId;

/// Deficit round robin over tenants (unit cost per claim, quantum = the tenant's weight).
#[derive(Debug, Default, Clone)]
pub(super) struct Ring {
    order: VecDeque<TenantId>,
    deficit: HashMap<TenantId, u64>,
}

impl Ring {
    /// Brings the ring in line with the tenants that have work now: new ones join at the back,
    /// gone ones leave (and lose their deficit, as DRR drops an emptied queue's).
    pub(super) fn refresh(&mut self, present: &[TenantId]) {
        let now: HashSet<TenantId> = present.iter().copied().collect();
        self.order.retain(|t| now.contains(t));
        self.deficit.retain(|t, _| now.contains(t));
        for t in present {
            if !self.deficit.contains_key(t) {
                self.deficit.insert(*t, 0);
                self.order.push_back(*t);
            }
        }
    }

    /// The tenants in serving order for this pick: the head first (topping its deficit up by
    /// its quantum when it has none left), then the rest.
    pub(super) fn candidates(&mut self, quantum: impl Fn(TenantId) -> u64) -> Vec<TenantId> {
        if let Some(head) = self.order.front().copied() {
            let d = self.deficit.entry(head).or_insert(0);
            if *d == 0 {
                *d = quantum(head).max(1);
            }
        }
        self.order.iter().copied().collect()
    }

    /// `tenant` got a claim: charge it; when its deficit is spent it goes to the back.
    pub(super) fn charge(&mut self, tenant: TenantId, quantum: impl Fn(TenantId) -> u64) {
        let d = self.deficit.entry(tenant).or_insert(0);
        if *d == 0 {
            // Served out of turn (the head had nothing claimable): a fresh quantum, spent.
            *d = quantum(tenant).max(1);
        }
        *d -= 1;
        if *d == 0
            && let Some(pos) = self.order.iter().position(|t| *t == tenant)
            && let Some(t) = self.order.remove(pos)
        {
            self.order.push_back(t);
        }
    }

    /// How `slots` claims would go one at a time, given what each tenant can take (`room`;
    /// a tenant without room is passed when its turn comes, as a claim answering nothing is):
    /// the steps, in order, on a copy of the ring. The ring itself is unchanged.
    pub(super) fn plan(
        &self,
        slots: usize,
        room: &HashMap<TenantId, u64>,
        quantum: impl Fn(TenantId) -> u64 + Copy,
    ) -> Vec<Step> {
        let mut sim = self.clone();
        let mut left = room.clone();
        let mut steps = Vec::new();
        for _ in 0..slots {
            let mut served = false;
            for t in sim.candidates(quantum) {
                match left.get_mut(&t) {
                    Some(n) if *n > 0 => {
                        *n -= 1;
                        sim.charge(t, quantum);
                        steps.push(Step::Serve(t));
                        served = true;
                        break;
                    }
                    _ => {
                        sim.pass(t);
                        steps.push(Step::Pass(t));
                    }
                }
            }
            if !served {
                break;
            }
        }
        steps
    }

    /// Applies a [`Ring::plan`]'s `steps` with the claims each tenant actually got (`got`,
    /// consumed): a serve is charged while the tenant's claims last; a tenant that got fewer
    /// than planned is passed (once) instead. With every share met this leaves the ring as
    /// claiming one at a time would.
    pub(super) fn replay(
        &mut self,
        steps: &[Step],
        got: &mut HashMap<TenantId, u64>,
        quantum: impl Fn(TenantId) -> u64 + Copy,
    ) {
        let mut passed = HashSet::new();
        for step in steps {
            match *step {
                Step::Pass(t) => self.pass(t),
                Step::Serve(t) => {
                    let _ = self.candidates(quantum);
                    match got.get_mut(&t) {
                        Some(n) if *n > 0 => {
                            *n -= 1;
                            self.charge(t, quantum);
                        }
                        _ => {
                            if passed.insert(t) {
                                self.pass(t);
                            }
                        }
                    }
                }
            }
        }
    }

    /// `tenant` had nothing claimable when asked: its turn is over for this round.
    pub(super) fn pass(&mut self, tenant: TenantId) {
        self.deficit.insert(tenant, 0);
        if let Some(pos) = self.order.iter().position(|t| *t == tenant)
            && let Some(t) = self.order.remove(pos)
        {
            self.order.push_back(t);
        }
    }
}

/// One step of a claim round planned by [`Ring::plan`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// The tenant gets a claim.
    Serve(TenantId),
    /// The tenant had nothing (more) to claim when its turn came.
    Pass(TenantId),
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn t(n: u128) -> TenantId {
        TenantId::from(uuid::Uuid::from_u128(n))
    }

    /// Serves the ring as the worker does when every tenant always has work: returns the
    /// sequence of tenants served.
    fn serve(ring: &mut Ring, weights: &HashMap<TenantId, u64>, picks: usize) -> Vec<TenantId> {
        let q = |x: TenantId| weights.get(&x).copied().unwrap_or(1);
        (0..picks)
            .map(|_| {
                let first = ring.candidates(q)[0];
                ring.charge(first, q);
                first
            })
            .collect()
    }

    #[test]
    fn equal_weights_alternate_whatever_the_backlog() {
        let mut ring = Ring::default();
        ring.refresh(&[t(1), t(2)]);
        let served = serve(&mut ring, &HashMap::new(), 6);
        assert_eq!(served, vec![t(1), t(2), t(1), t(2), t(1), t(2)]);
    }

    #[test]
    fn a_newcomer_is_served_within_one_round() {
        let mut ring = Ring::default();
        ring.refresh(&[t(1), t(2), t(3)]);
        let _ = serve(&mut ring, &HashMap::new(), 2);
        ring.refresh(&[t(1), t(2), t(3), t(9)]);
        let served = serve(&mut ring, &HashMap::new(), 4);
        assert!(served.contains(&t(9)), "{served:?}");
    }

    #[test]
    fn weights_are_claims_per_round() {
        let mut ring = Ring::default();
        ring.refresh(&[t(1), t(2)]);
        let weights = HashMap::from([(t(1), 3)]);
        let served = serve(&mut ring, &weights, 8);
        assert_eq!(served, vec![t(1), t(1), t(1), t(2), t(1), t(1), t(1), t(2)]);
    }

    #[test]
    fn a_tenant_with_nothing_claimable_loses_its_turn_not_its_place() {
        let mut ring = Ring::default();
        ring.refresh(&[t(1), t(2)]);
        let q = |_: TenantId| 1;
        assert_eq!(ring.candidates(q), vec![t(1), t(2)]);
        ring.pass(t(1));
        ring.charge(t(2), q);
        // t(2) was served out of turn; t(1) is next again.
        assert_eq!(ring.candidates(q)[0], t(1));
        // A tenant without work leaves the ring.
        ring.refresh(&[t(2)]);
        assert_eq!(ring.candidates(q), vec![t(2)]);
    }

    fn served(steps: &[Step]) -> Vec<TenantId> {
        steps
            .iter()
            .filter_map(|s| match s {
                Step::Serve(t) => Some(*t),
                Step::Pass(_) => None,
            })
            .collect()
    }

    #[test]
    fn one_round_shares_every_free_slot_with_one_tenant() {
        let mut ring = Ring::default();
        ring.refresh(&[t(1)]);
        let room = HashMap::from([(t(1), 1000)]);
        let steps = ring.plan(100, &room, |_| 1);
        assert_eq!(served(&steps), vec![t(1); 100]);
        // Fewer claimable than slots: the round takes them all, then stops.
        let room = HashMap::from([(t(1), 7)]);
        assert_eq!(served(&ring.plan(100, &room, |_| 1)), vec![t(1); 7]);
    }

    #[test]
    fn a_planned_round_serves_as_claims_one_at_a_time_would() {
        let weights = HashMap::from([(t(1), 3)]);
        let q = |x: TenantId| weights.get(&x).copied().unwrap_or(1);
        let mut ring = Ring::default();
        ring.refresh(&[t(1), t(2)]);
        let mut one_by_one = ring.clone();
        let expected = serve(&mut one_by_one, &weights, 8);
        let room = HashMap::from([(t(1), 100), (t(2), 100)]);
        let steps = ring.plan(8, &room, q);
        assert_eq!(served(&steps), expected);
        // Every share met: the ring ends as after the eight single claims.
        let mut got = HashMap::from([(t(1), 6), (t(2), 2)]);
        ring.replay(&steps, &mut got, q);
        assert_eq!(ring.order, one_by_one.order);
        assert_eq!(ring.deficit, one_by_one.deficit);
    }

    /// Tenants 1 and 2 (weight 1) able to take `room1` and `room2` sessions: the ring and
    /// the plan of a round of `slots`.
    fn planned(room1: u64, room2: u64, slots: usize) -> (Ring, Vec<Step>) {
        let mut ring = Ring::default();
        ring.refresh(&[t(1), t(2)]);
        let room = HashMap::from([(t(1), room1), (t(2), room2)]);
        let steps = ring.plan(slots, &room, |_| 1);
        (ring, steps)
    }

    #[test]
    fn a_light_tenant_gets_its_slot_in_the_first_round_next_to_a_heavy_one() {
        let (_, steps) = planned(1000, 1, 10);
        let s = served(&steps);
        assert_eq!(s[..2].to_vec(), vec![t(1), t(2)]);
        assert_eq!(s.iter().filter(|x| **x == t(1)).count(), 9);
        assert_eq!(s.iter().filter(|x| **x == t(2)).count(), 1);
    }

    #[test]
    fn a_tenant_short_of_its_share_is_passed_once() {
        let (mut ring, steps) = planned(100, 100, 4);
        assert_eq!(served(&steps), vec![t(1), t(2), t(1), t(2)]);
        // t(1) got one claim of its two: charged once, then passed; t(2) got both.
        let mut got = HashMap::from([(t(1), 1), (t(2), 2)]);
        ring.replay(&steps, &mut got, |_| 1);
        assert_eq!(got.values().sum::<u64>(), 0, "every claim charged");
        assert_eq!(ring.deficit[&t(1)], 0);
        assert_eq!(ring.order.len(), 2);
    }
}
