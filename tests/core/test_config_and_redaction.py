"""Configuration sources and validation; redaction of secrets in model-facing text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

import loop_governor as lg
from loop_governor.errors import read_model_text


def test_defaults_are_the_seeds() -> None:
    c = lg.GovernorConfig()
    assert (c.retry_max_attempts, c.retry_base_delay, c.retry_max_delay, c.retry_jitter) == (3, 0.8, 8.0, 0.5)
    assert (c.task_retry_budget, c.breaker_failure_threshold, c.breaker_cooldown_s) == (6, 5, 60)
    assert (c.repeated_error_threshold, c.max_steps, c.unknown_error, c.store_url) == (
        3,
        None,
        "permanent",
        "memory://",
    )


def test_env_and_nested_tool_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOP_GOVERNOR_RETRY_MAX_ATTEMPTS", "5")
    monkeypatch.setenv("LOOP_GOVERNOR_TOOLS", json.dumps({"send_email": {"retry": False}}))
    c = lg.GovernorConfig()
    assert c.retry_max_attempts == 5
    assert c.policy_for("send_email").max_attempts == 1
    assert c.policy_for("search").max_attempts == 5


def test_toml_file_with_env_winning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "governor.toml"
    path.write_text(
        "[loop_governor]\nretry_max_attempts = 4\ntask_retry_budget = 9\n"
        "[loop_governor.tools.charge_card]\nretry = false\n"
    )
    monkeypatch.setenv("LOOP_GOVERNOR_TASK_RETRY_BUDGET", "2")
    c = lg.GovernorConfig.from_toml(path)
    assert c.retry_max_attempts == 4 and c.task_retry_budget == 2
    assert c.policy_for("charge_card").max_attempts == 1
    monkeypatch.setenv("LOOP_GOVERNOR_CONFIG_FILE", str(path))
    assert lg.GovernorConfig().retry_max_attempts == 4


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"retry_max_attempts": 0}, "retry_max_attempts"),
        ({"retry_jitter": 2}, "retry_jitter"),
        ({"unknown_error": "maybe"}, "unknown_error"),
        ({"store_url": "mongodb://x"}, "store_url"),
        ({"retry_base_delay": 10, "retry_max_delay": 1}, "retry_base_delay"),
        ({"typo_field": 1}, "typo_field"),
    ],
)
def test_invalid_config_fails_clearly(kwargs: dict, field: str) -> None:
    with pytest.raises(ValidationError) as err:
        lg.GovernorConfig(**kwargs)
    assert field in str(err.value)


def test_missing_config_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="config file not found"):
        lg.GovernorConfig.from_toml(tmp_path / "nope.toml")


@pytest.mark.parametrize(
    "secret",
    [
        "sk-proj-abcdefghijklmnop1234",
        "sk-ant-api03-abcdefghijklmnop",
        "AKIAIOSFODNN7EXAMPLE",
        "AIzaSyA1234567890abcdefghijklmnopqrstuv",
        "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    ],
)
def test_redact_known_key_formats(secret: str) -> None:
    assert secret not in lg.redact(f"request failed with key {secret} at step 3")


def test_redact_bearer_password_and_params() -> None:
    text = (
        "Authorization: Bearer abcdef1234567890xyz; url=postgres://app:s3cr3tpw@db:5432/x "
        'api_key=zzz999yyy "password": "hunter22"'
    )
    out = lg.redact(text)
    for secret in ("abcdef1234567890xyz", "s3cr3tpw", "zzz999yyy", "hunter22"):
        assert secret not in out
    assert "postgres://app:" in out  # the user name stays: it helps debugging


def test_model_text_is_stable_compact_and_bounded() -> None:
    info = lg.GovernedError(
        error_type="transient",
        tool="search",
        status=503,
        message="x" * 2000,
        signature="s",
        attempts=3,
        advice="use another tool",
    )
    text = info.to_model_text("json")
    assert text == lg.GovernedError.model_validate_json(info.model_dump_json()).to_model_text("json")
    body = json.loads(text)["error"]
    assert list(body) == ["message", "type", "outcome", "tool", "status", "attempts", "advice"]
    assert body["outcome"] == "retries exhausted: 3 attempts"
    assert len(body["message"]) <= 500
    head = text.split('"message"')[0]
    assert ', "' not in head and '": ' not in head  # compact separators


def test_the_default_model_text_is_plain_stable_and_leads_with_the_tools_message() -> None:
    info = lg.GovernedError(
        error_type="transient", tool="search", status=503, message="x" * 2000, signature="s", attempts=3,
        advice="use another tool",
    )
    text = info.to_model_text()
    assert text == lg.GovernedError.model_validate_json(info.model_dump_json()).to_model_text()
    first, second = text.split("\n")
    assert first.startswith("Error: xxx") and len(first) <= len("Error: ") + 500
    assert second == "Temporary failure, retries exhausted after 3 attempts: use another tool."
    assert read_model_text(text) == {
        "message": info.message, "type": "transient", "outcome": "retries exhausted after 3 attempts",
        "advice": "use another tool",
    }
    # the configured format is what every governed outcome renders in
    g = lg.Governor(lg.GovernorConfig(error_format="json", retry_max_attempts=1))
    with pytest.raises(lg.AgentToolError) as caught:
        g.call("search", _raise, ValueError("nope"))
    assert json.loads(caught.value.info.to_model_text())["error"]["message"] == "ValueError: nope"
    assert caught.value.info.to_model_text("text").startswith("Error: ValueError: nope\nPermanent failure: ")


def _raise(exc: Exception) -> None:
    raise exc


@pytest.mark.parametrize(
    "text",
    [
        "Answer: this is a basic explanation of caching",
        "invalid input: Basic authentication is not enabled",
        "token validation failed for request 7",
        '{"pwd": "/home/alice/project"}',
        "see the bearer of bad news",
    ],
)
def test_redaction_leaves_ordinary_text_alone(text: str) -> None:
    # checkpoints and model text are redacted: a false positive changes what a resume returns
    assert lg.redact(text) == text


def test_authorization_header_is_masked_whatever_the_scheme() -> None:
    for header in (
        "Authorization: Bearer abcdef1234567890xyz",
        "authorization=Basic dXNlcjpwYXNzd29yZA==",
        '"Authorization": "Token 9f8e7d6c5b4a"',
    ):
        out = lg.redact(header)
        assert "[REDACTED]" in out and not any(s in out for s in ("abcdef1234", "dXNlcjpw", "9f8e7d6c"))


def test_env_tool_policies_survive_lower_casing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOP_GOVERNOR_TOOLS__sendEmail__RETRY", "false")  # arrives as "sendemail"
    assert lg.GovernorConfig().policy_for("sendEmail").max_attempts == 1


@pytest.mark.parametrize(
    "name",
    [
        "password",
        "api_key",
        "OPENAI_API_KEY",
        "db_password",
        "userPassword",
        "apiKey",
        "x-api-key",
        "github_access_token",
        "ssh_private_key",
        "Authorization",
        "client_secret",
        "access_token",
        "token",  # issue 27: login(user, password, token)
        "Token",
    ],
)
def test_secret_named_keys(name: str) -> None:
    from loop_governor.redaction import is_secret_key

    assert is_secret_key(name)


@pytest.mark.parametrize(
    "name",
    [
        *("tool", "status", "key", "max_tokens", "token_count", "cwd", "role", "kind", "next_token", "pwd"),
        *("page_token", "cursor", "tokens"),  # cursors and counts, not credentials
    ],
)
def test_ordinary_keys_are_not_secret(name: str) -> None:
    from loop_governor.redaction import is_secret_key

    assert not is_secret_key(name)


def test_redact_obj_masks_whole_values_under_secret_keys_at_any_depth() -> None:
    # Regression: each string was redacted alone, so {"password": "hunter2-correct"} survived.
    from loop_governor.redaction import redact_obj

    value = {
        "args": [{"password": "hunter2 correct", "api_key": "ab,cdef0123456789", "n": 3}],
        "auth": {"auth_token": ["t1-value", "t2-value"]},
        "note": "plain text",
    }
    assert redact_obj(value) == {
        "args": [{"password": "[REDACTED]", "api_key": "[REDACTED]", "n": 3}],
        "auth": {"auth_token": ["[REDACTED]", "[REDACTED]"]},
        "note": "plain text",
    }


def test_mask_url_drops_the_password_with_or_without_a_user() -> None:
    from loop_governor.redaction import mask_url

    assert mask_url("redis://:SuperSecretPw123@127.0.0.1:6379/0") == "redis://:[REDACTED]@127.0.0.1:6379/0"
    assert mask_url("redis://bob:SuperSecretPw123@h/0") == "redis://bob:[REDACTED]@h/0"
    assert mask_url("file:///var/ck") == "file:///var/ck"


# -- issue 17: the formats that survived redaction ------------------------------------------
_JSON_PASSWORD = 'a b,c;d"e f'


@pytest.mark.parametrize(
    ("text", "secrets"),
    [
        ("dsn postgres://app:p@ss/w0rd-9@db.internal:5432/app failed", ["p@ss/w0rd-9", "ss/w0rd"]),
        ("redis://:pa/ss@word@127.0.0.1:6379/0 unreachable", ["pa/ss@word", "ss@word"]),
        ("https://bob@example.com:hunter2/x@api.example.com/v1", ["hunter2"]),
        ("GET https://s3.example.com/o?X-Amz-Signature=d34db33f&X-Amz-Credential=AKX/20240101", ["d34db33f", "AKX"]),
        ("https://api.example.com/v1?token=tkn12345&key=kee98765&sig=sg55555", ["tkn12345", "kee98765", "sg55555"]),
        ("https://x.example.com/cb#access_token=atk0001&id_token=itk0002", ["atk0001", "itk0002"]),
        ("https://storage.example.com/b?X-Goog-Signature=gsig777&AWSAccessKeyId=AWSK888", ["gsig777", "AWSK888"]),
        ("?client_secret=csec1&refresh_token=rtok2&api_key=akey3&apikey=akey4", ["csec1", "rtok2", "akey3", "akey4"]),
        ("env: DB_PASSWORD=dbpw111 PGPASSWORD=pgpw222 MY_SECRET=mys333", ["dbpw111", "pgpw222", "mys333"]),
        ("OPENAI_API_KEY=notansk444 GITHUB_TOKEN=ghtk555 MYSQL_PWD=mypw666", ["notansk444", "ghtk555", "mypw666"]),
        ("STRIPE_API_KEY: stripe777\nREDISCLI_AUTH=rauth888", ["stripe777", "rauth888"]),
        (json.dumps({"password": _JSON_PASSWORD, "user": "bob"}), ["a b", "c;d", "e f"]),
        (json.dumps({"arguments": json.dumps({"password": _JSON_PASSWORD})}), ["a b", "c;d", "e f"]),
        (json.dumps({"a": json.dumps({"b": json.dumps({"db_password": _JSON_PASSWORD})})}), ["a b", "c;d", "e f"]),
        (repr({"password": "it is, really; long"}), ["it is", "really", "long"]),
        ("Cookie: session=cks111; theme=dark\r\nHost: x", ["cks111", "dark"]),
        ("Set-Cookie: sid=cks222; Path=/; HttpOnly", ["cks222"]),
        (repr({"Cookie": "sid=cks333; a=b"}), ["cks333"]),
        (
            "key file:\n-----BEGIN RSA PRIVATE KEY-----\nMIIEpem111\npem222==\n-----END RSA PRIVATE KEY-----\ndone",
            ["pem111", "pem222"],
        ),
        (json.dumps("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1pem333\npem444"), ["pem333", "pem444"]),
    ],
)
def test_redaction_masks_the_issue_17_formats(text: str, secrets: list[str]) -> None:
    out = lg.redact(text)
    assert [s for s in secrets if s in out] == []
    assert lg.redact(out) == out  # idempotent: every sink may redact again


def test_redaction_keeps_what_is_around_the_secret() -> None:
    assert (
        lg.redact("postgres://app:p@ss/w0rd@db.internal:5432/app") == "postgres://app:[REDACTED]@db.internal:5432/app"
    )
    assert lg.redact(json.dumps({"password": _JSON_PASSWORD, "user": "bob"})) == (
        '{"password": "[REDACTED]", "user": "bob"}'
    )
    assert lg.redact("Cookie: a=1; b=2\nHost: example.com") == "Cookie: [REDACTED]\nHost: example.com"
    assert lg.redact("-----BEGIN EC PRIVATE KEY-----\nMHc\n-----END EC PRIVATE KEY-----\nok") == (
        "-----BEGIN EC PRIVATE KEY-----[REDACTED]-----END EC PRIVATE KEY-----\nok"
    )


@pytest.mark.parametrize(
    "text",
    [
        "http://localhost:8080/path?user=alice@example.com",
        "https://bob@example.com:8443/users/x",
        "https://api.example.com/v1/items?page=2&sort=name",
        "PWD=/home/alice next_token=abc123 page_token=xyz",
        '{"max_tokens": 100, "key": "user:42", "token_count": 5, "sort_key": "name"}',
        "auth: failed for user bob; credentials: invalid",
        '{"password": null, "api_key": ""}',
        "the cookie jar; a passport; keyboard=us",
    ],
)
def test_issue_17_rules_leave_ordinary_text_alone(text: str) -> None:
    assert lg.redact(text) == text


@pytest.mark.parametrize("name", ["PGPASSWORD", "Set-Cookie", "cookies", "basic_auth", "db_pass", "credentials"])
def test_secret_named_keys_issue_17(name: str) -> None:
    from loop_governor.redaction import is_secret_key

    assert is_secret_key(name)


def test_mask_url_handles_passwords_with_at_and_slash() -> None:
    from loop_governor.redaction import mask_url

    assert mask_url("redis://:p@ss/w0rd@10.0.0.1:6379/0") == "redis://:[REDACTED]@10.0.0.1:6379/0"


_FRAGMENTS = [
    "github_pat_11AB0123456789_xyzXYZ",
    "ghp_0123456789abcdefghijklmnopqrstuvwxyz",
    "AKIAIOSFODNN7EXAMPLE",
    "AIzaSyA1234567890abcdefghijklmnopqrstuv",
    "sk-proj-abcdefghijklmnop",
    "xoxb-0123456789-abc",
    "hf_abcdefghijklmnopqrstu",
    "eyJhbGciOiJI.eyJzdWIiOiIx.dozjgNryP4J3",
    "ya29.a0AfH6SMBx0123456789abcd",
    "glpat-0123456789abcdefghij",
    "postgres://u:p@ss/w@db:1/x",
    "?token=abc",
    "&X-Amz-Signature=ff",
    "Bearer abcdef12345",
    "Authorization: Basic dXNl",
    "-----BEGIN RSA PRIVATE KEY-----\nMIIE",
    "-----END RSA PRIVATE KEY-----",
    "Cookie: a=b; c=d",
    "DB_PASSWORD=x1",
    '"password": "a b\\"c"',
    '\\"api_key\\": \\"x y\\"',
    "GITHUB_TOKEN=abc",
    " ",
    "\n",
    '"',
    "'",
    ":",
    "=",
    "&",
    "x",
    "é",
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_FRAGMENTS) | st.text(max_size=6), max_size=12))
def test_the_fragment_prechecks_never_skip_a_rule_that_would_match(parts: list[str]) -> None:
    from loop_governor.redaction import _RULES

    text = "".join(parts)
    unchecked = text
    for rule in _RULES:
        unchecked = rule.apply(unchecked)
    assert lg.redact(text) == unchecked
    assert lg.redact(lg.redact(text)) == lg.redact(text)
