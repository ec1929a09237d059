-- 0006: webhook subscriptions, the endpoints the built-in WEBHOOK kind delivers to.
--
-- One row a subscriber endpoint. enqueue_webhook enqueues one WEBHOOK action per enabled row
-- whose event_types match (a '*' matches every event type), each on the lane
-- 'webhook:<id>' so that one endpoint's deliveries stay in order. The adapter reads the row at
-- every attempt: a removed subscription cancels its actions, a disabled one makes them wait.
-- secrets holds the signing secrets (whsec_...), newest first; every one signs each delivery,
-- so a receiver can switch secrets while the old one is still accepted. consecutive_failures
-- counts deliveries the endpoint did not accept since its last accepted one; at the adapter's
-- limit the row is disabled (disabled_at, disabled_reason) until an operator enables it again.

CREATE TABLE webhook_subscription (
    id                   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    endpoint_url         text NOT NULL CHECK (endpoint_url ~* '^https?://'),
    secrets              text[] NOT NULL CHECK (cardinality(secrets) >= 1),
    event_types          text[] NOT NULL CHECK (cardinality(event_types) >= 1),
    enabled              boolean NOT NULL DEFAULT true,
    consecutive_failures integer NOT NULL DEFAULT 0 CHECK (consecutive_failures >= 0),
    disabled_at          timestamptz,
    disabled_reason      text,
    created_at           timestamptz NOT NULL DEFAULT now(),
    CHECK (enabled = (disabled_at IS NULL))
);

-- enqueue_webhook's lookup: the enabled subscriptions, whatever their event types.
CREATE INDEX ix_webhook_subscription_enabled ON webhook_subscription (id) WHERE enabled;
