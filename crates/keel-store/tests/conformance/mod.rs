//! One conformance suite, two instantiations: every case runs as `conformance::sqlite::<case>`
//! and `conformance::postgres::<case>`, on a fresh, isolated store.

pub mod access;
pub mod batch_claims;
pub mod cases;
pub mod crash;
pub mod harness;
pub mod intents;
pub mod lease_batches;
pub mod reservations;
pub mod scheduling;
pub mod withdraw;

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
    create_session_leased_takes_the_lease_in_one_commit,
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
    memory_search_makes_the_same_words_on_both_backends,
    memory_search_ranks_limits_and_stays_in_its_tenant,
    tenant_isolation_of_leases_effects_and_approvals,
    opening_a_store_is_send,
    sessions_page_and_due_timers_span_tenants,
    an_event_row_whose_type_disagrees_is_corrupt,
    append_with_writes_events_and_extras_atomically,
    stale_append_with_writes_none_of_its_extras,
    a_failing_extra_makes_the_whole_append_write_nothing,
    a_claimed_effect_past_prepared_refuses_the_whole_append,
    usage_accumulates_and_is_tenant_scoped,
    concurrent_append_with_applies_each_requests_extras_once,
    commit_counts_follow_committed_writes,
    sealed_rows_commit_with_the_journal,
    a_re_pin_moves_the_session_row_with_its_event,
    usage_reservations_are_capped_refused_and_settled_with_the_usage,
    concurrent_reservers_never_hold_more_than_the_limit,
    a_reservation_lapses_with_its_lease,
    transcript_rows_commit_with_the_journal,
    tenants_are_created_listed_and_unique_by_name,
    api_keys_store_hashes_with_roles_scopes_expiry_and_revocation,
    idempotency_replays_refuses_other_bodies_and_reports_in_flight,
    idempotency_records_expire_are_cleaned_up_and_stale_ones_taken_over,
    concurrent_idempotency_begins_start_exactly_once,
    approvals_record_who_decided_and_page_per_tenant,
    api_lists_page_sessions_by_release_artifacts_memory_and_releases,
    a_migrated_store_is_ready,
    a_workspace_is_one_tenants_with_the_directories_above_and_below_it,
    appends_mark_sessions_runnable_and_keep_runnable_since,
    batched_appends_mark_each_session,
    claims_follow_priority_then_age_then_timers_and_intents,
    claims_skip_held_deferred_and_newer_schema_sessions_and_take_over_expired_ones,
    decisions_and_intents_make_a_session_claimable,
    concurrent_claimers_never_claim_a_session_twice,
    concurrent_claimers_never_take_a_tenant_past_its_session_limit,
    batch_claims_take_up_to_k_in_claim_order_within_the_limit,
    a_claim_of_over_a_thousand_sessions_takes_every_lease,
    expired_leases_are_taken_over_in_one_batch_with_their_epochs_bumped,
    concurrent_batch_claimers_never_claim_a_session_twice,
    renew_leases_renews_every_held_lease_in_one_statement_and_leaves_out_the_lost,
    renew_leases_takes_more_than_one_statement_batch,
    a_claimer_leaves_its_own_expired_lease_to_its_renewal_for_a_ttl,
    wait_for_work_is_woken_by_work_from_another_handle,
    token_windows_admit_refuse_and_settle,
    concurrent_token_reservations_never_exceed_the_limit,
    queue_depths_and_session_counts,
    a_lease_of_the_longest_ttl_is_held_not_wrapped_into_the_past,
    withdrawing_a_turns_approvals_expires_only_its_pending_rows,
    consuming_an_intent_commits_with_its_row_or_writes_nothing,
    consuming_an_intent_and_withdrawing_it_exclude_each_other,
);
