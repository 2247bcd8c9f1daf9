//! One conformance suite, two instantiations: every case runs as `conformance::sqlite::<case>`
//! and `conformance::postgres::<case>`, on a fresh, isolated store.

pub mod cases;
pub mod crash;
pub mod harness;
pub mod reservations;

macro_rules! conformance {
    ($($case:ident),* $(,)?) => {
        pub mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let h = super::harness::sqlite().await;
                    super::cases::$case(&h).await;
                }
            )*
        }
        pub mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let h = super::harness::postgres().await;
                    super::cases::$case(&h).await;
                }
            )*
        }
    };
}

conformance!(
    create_and_get_session,
    create_session_twice_conflicts,
    append_and_read,
    append_cas,
    concurrent_appends_at_one_version_one_wins,
    append_rejects_malformed_batches,
    status_projection_follows_the_journal,
    lease_acquire_renew_release,
    lease_held_by_another_is_refused,
    fencing_expired_lease_taken_over_cannot_append,
    released_lease_cannot_append,
    take_over_lease_of_dead_owner,
    cancelled_appends_leave_no_partial_batch,
    wait_for_version_wakes_on_append,
    wait_for_version_wakes_across_store_instances,
    tenant_isolation,
    effects_insert_if_absent_and_transitions,
    approvals_decide_idempotently_and_expire,
    transcript_append_and_read,
    memory_put_get_search_delete,
    artifacts_round_trip_bytes,
    releases_are_content_addressed,
    list_sessions_and_wake_up_times,
    delete_session_removes_everything,
    corrupt_event_rows_are_typed_errors,
    migrations_are_idempotent_and_refuse_foreign_schemas,
    many_sessions_append_concurrently,
    crash_mid_append_keeps_every_committed_event,
    intents_are_posted_listed_and_deleted,
    edge_inputs_are_typed_errors,
    an_abandoned_append_is_not_committed_later,
    memory_search_folds_ascii_and_matches_exact_text,
    tenant_isolation_of_leases_effects_and_approvals,
    opening_a_store_is_send,
    sessions_page_and_due_timers_span_tenants,
    an_event_row_whose_type_disagrees_is_corrupt,
    append_with_writes_events_and_extras_atomically,
    stale_append_with_writes_none_of_its_extras,
    a_failing_extra_makes_the_whole_append_write_nothing,
    usage_accumulates_and_is_tenant_scoped,
    concurrent_append_with_applies_each_requests_extras_once,
    commit_counts_follow_committed_writes,
    sealed_rows_commit_with_the_journal,
    a_re_pin_moves_the_session_row_with_its_event,
    usage_reservations_are_capped_refused_and_settled_with_the_usage,
    concurrent_reservers_never_hold_more_than_the_limit,
    a_reservation_lapses_with_its_lease,
    transcript_rows_commit_with_the_journal,
);
