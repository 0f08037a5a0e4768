"""Sign-in through an identity provider: how each user signs in, who they are there, sign-ins on their way,
and groups of users.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-07

Frozen like every migration: it names its own column types and imports nothing from serge.
`users.signed_in_by` is "password" for the accounts made before (and by `serge users add`);
`users.external_id` names a user at their provider ("oidc:{issuer}#{sub}"), unique, so a
sign-in finds its account by it and never by a name; `users.pending`: made at a first sign-in and
waiting for an admin's approval (SERGE_NEW_USERS_PENDING). `pending_sign_ins` holds one row per
sign-in sent to the provider (its state's hash, nonce and PKCE verifier), taken once at the callback.
`user_groups` and `group_members`: groups of users, made by admins or named by a provider; `shares`:
a model, preset or tool server shared with groups (none: everyone's, as before); `audit_log`: admin
actions, who did what when.
"""

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

UTCDateTime = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("users") as users:
        users.add_column(sa.Column("signed_in_by", sa.String(16), nullable=False, server_default="password"))
        users.add_column(sa.Column("external_id", sa.String(320)))
        users.add_column(sa.Column("email", sa.String(320)))
        users.add_column(sa.Column("pending", sa.Boolean, nullable=False, server_default=sa.false()))
    op.create_index("ix_users_external_id", "users", ["external_id"], unique=True)
    op.create_table(
        "pending_sign_ins",
        sa.Column("state_hash", sa.String(64), primary_key=True),
        sa.Column("nonce", sa.String(128), nullable=False),
        sa.Column("code_verifier", sa.String(128), nullable=False),
        sa.Column("redirect_uri", sa.String(1000), nullable=False),
        sa.Column("next", sa.String(2000), nullable=False),
        sa.Column("expires_at", UTCDateTime, nullable=False),
    )
    op.create_index("ix_pending_sign_ins_expires_at", "pending_sign_ins", ["expires_at"])
    op.create_table(
        "user_groups",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(100), nullable=False, unique=True),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("created_at", UTCDateTime, nullable=False),
    )
    op.create_table(
        "group_members",
        sa.Column("group_id", sa.String(32), sa.ForeignKey("user_groups.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("user_id", sa.String(32), sa.ForeignKey("users.id", ondelete="CASCADE"), primary_key=True),
    )
    op.create_index("ix_group_members_user_id", "group_members", ["user_id"])
    op.create_table(
        "shares",
        sa.Column("kind", sa.String(16), primary_key=True),
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("group_id", sa.String(32), sa.ForeignKey("user_groups.id", ondelete="CASCADE"), primary_key=True),
    )
    op.create_index("ix_shares_group_id", "shares", ["group_id"])
    op.create_table(
        "audit_log",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("at", UTCDateTime, nullable=False),
        sa.Column("actor", sa.String(100), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("target", sa.String(500), nullable=False),
    )
    op.create_index("ix_audit_log_at", "audit_log", ["at"])


def downgrade() -> None:
    op.drop_table("audit_log")
    op.drop_table("shares")
    op.drop_table("group_members")
    op.drop_table("user_groups")
    op.drop_table("pending_sign_ins")
    op.drop_index("ix_users_external_id", "users")
    with op.batch_alter_table("users") as users:
        users.drop_column("pending")
        users.drop_column("email")
        users.drop_column("external_id")
        users.drop_column("signed_in_by")
