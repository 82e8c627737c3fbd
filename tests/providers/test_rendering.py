"""Templates: built-ins for every kind, escaping, overrides and errors that keep secrets out."""

from __future__ import annotations

from pathlib import Path

import pytest

from leasebox.delivery.rendering import BUILTIN_TEMPLATES, RenderedEmail, TemplateRenderer
from leasebox.errors import TemplateError

CODE = "918273"
LINK = "https://app.example.com/verify?token=t0k3n&user=42"


@pytest.fixture
def renderer() -> TemplateRenderer:
    return TemplateRenderer()


def test_the_otp_email_shows_the_code_and_how_long_it_is_valid(
    renderer: TemplateRenderer,
) -> None:
    email = renderer.render("otp", {"minutes_valid": 10, "product_name": "Acme"}, {"code": CODE})

    assert email.subject == "Your Acme verification code"
    assert CODE not in email.subject
    assert f"    {CODE}\n" in email.text
    assert "valid for 10 minutes" in email.text
    assert email.html is not None
    assert f">{CODE}</p>" in email.html
    assert "10 minutes" in email.html
    assert '<html lang="en">' in email.html


def test_the_otp_email_says_one_minute_in_the_singular(renderer: TemplateRenderer) -> None:
    email = renderer.render("otp", {"minutes_valid": 1}, {"code": CODE})

    assert "valid for 1 minute." in email.text


def test_the_otp_email_leaves_out_the_validity_when_it_is_not_given(
    renderer: TemplateRenderer,
) -> None:
    email = renderer.render("otp", {}, {"code": CODE})

    assert "valid" not in email.text


@pytest.mark.parametrize("template", BUILTIN_TEMPLATES)
def test_an_unbranded_email_names_no_product_and_a_branded_one_names_yours(
    renderer: TemplateRenderer, template: str
) -> None:
    variables = {"code": CODE, "link": LINK, "inviter": "Ada"}
    plain = renderer.render(template, {}, variables)
    branded = renderer.render(template, {"product_name": "Acme"}, variables)

    assert all(
        "leasebox" not in part.lower() for part in (plain.subject, plain.text, plain.html or "")
    )
    assert "Acme" in branded.text
    assert branded.html is not None
    assert ">Acme</p>" in branded.html  # the header line of the layout
    assert "Acme" in branded.subject


@pytest.mark.parametrize("template", ["verification", "password_reset"])
def test_link_emails_show_the_link_in_text_and_html(
    renderer: TemplateRenderer, template: str
) -> None:
    email = renderer.render(template, {"name": "Ada", "minutes_valid": 30}, {"link": LINK})

    assert f"\n{LINK}\n" in email.text
    assert "Hi Ada," in email.text
    assert "30 minutes" in email.text
    assert email.html is not None
    assert f'href="{LINK.replace("&", "&amp;")}"' in email.html


def test_the_invite_email_names_the_inviter_and_the_team(renderer: TemplateRenderer) -> None:
    email = renderer.render(
        "invite", {"inviter": "Grace Hopper", "team_name": "Compilers"}, {"link": LINK}
    )

    assert email.subject == "Grace Hopper invited you to Compilers"
    assert "Grace Hopper invited you to join Compilers." in email.text
    assert LINK in email.text
    assert email.html is not None
    assert "<strong>Grace Hopper</strong>" in email.html


def test_every_built_in_template_renders_text_and_html(renderer: TemplateRenderer) -> None:
    variables = {"code": CODE, "link": LINK, "inviter": "Ada"}

    for template in BUILTIN_TEMPLATES:
        email = renderer.render(template, {}, variables)
        assert email.subject
        assert "\n" not in email.subject
        assert email.text.endswith("\n")
        assert email.html is not None
        assert email.html.lstrip().startswith("<!DOCTYPE html>")
        assert renderer.has_template(template)


def test_html_is_escaped_and_text_is_not(renderer: TemplateRenderer) -> None:
    inviter = "<script>alert('x')</script>"

    email = renderer.render("invite", {"inviter": inviter}, {"link": LINK})

    assert email.html is not None
    assert "<script>" not in email.html
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in email.html
    assert inviter in email.text


def test_a_newline_in_a_variable_cannot_add_a_header_line(renderer: TemplateRenderer) -> None:
    email = renderer.render("invite", {"inviter": "Eve\r\nBcc: all@example.com"}, {"link": LINK})

    assert email.subject == "Eve Bcc: all@example.com invited you"


def test_a_templates_directory_overrides_one_file_and_falls_back_for_the_rest(
    tmp_path: Path,
) -> None:
    (tmp_path / "otp").mkdir()
    (tmp_path / "otp" / "subject.txt.j2").write_text("{{ product_name }} sign-in code\n")

    email = TemplateRenderer(tmp_path).render("otp", {"product_name": "Acme"}, {"code": CODE})

    assert email.subject == "Acme sign-in code"
    assert CODE in email.text
    assert email.html is not None
    assert CODE in email.html


def test_a_new_template_without_html_renders_text_only(tmp_path: Path) -> None:
    (tmp_path / "welcome").mkdir()
    (tmp_path / "welcome" / "subject.txt.j2").write_text("Welcome, {{ name }}")
    (tmp_path / "welcome" / "body.txt.j2").write_text("Hello {{ name }}!\n")

    email = TemplateRenderer(tmp_path).render("welcome", {"name": "Ada"}, {})

    assert email == RenderedEmail(subject="Welcome, Ada", text="Hello Ada!\n", html=None)


def test_a_missing_template_is_a_template_error(renderer: TemplateRenderer) -> None:
    with pytest.raises(TemplateError, match=r"template 'newsletter' has no subject\.txt\.j2"):
        renderer.render("newsletter", {}, {})
    assert not renderer.has_template("newsletter")


@pytest.mark.parametrize("name", ["../etc", "otp/../../x", "OTP", ""])
def test_a_template_name_outside_the_pattern_is_refused(
    renderer: TemplateRenderer, name: str
) -> None:
    with pytest.raises(TemplateError, match="is not valid"):
        renderer.render(name, {}, {})


def test_an_undefined_variable_is_a_template_error_naming_it(renderer: TemplateRenderer) -> None:
    with pytest.raises(TemplateError) as caught:
        renderer.render("otp", {"minutes_valid": 5}, {})

    assert "'code' is undefined" in str(caught.value)
    assert "otp/" in str(caught.value)


def test_a_template_error_never_quotes_a_secret(tmp_path: Path) -> None:
    (tmp_path / "leaky").mkdir()
    (tmp_path / "leaky" / "subject.txt.j2").write_text("{{ {}[code] }}")
    (tmp_path / "leaky" / "body.txt.j2").write_text("{{ code }}")

    with pytest.raises(TemplateError) as caught:
        TemplateRenderer(tmp_path).render("leaky", {}, {"code": CODE})

    assert CODE not in str(caught.value)


@pytest.mark.parametrize(
    "expression",
    [
        "{{ lookup[code | reverse] }}",
        "{{ lookup[code ~ 'x'] }}",
        "{{ lookup[code | replace('4', '7')] }}",
        "{{ lookup[code[1:]] }}",
        "{{ lookup[code | list | join('-')] }}",
        "{{ code | reverse | attr('nope') }}",
        "{{ (code | reverse) is divisibleby(3) }}",
        "{{ lookup[code | reverse | int + 1] }}",
    ],
)
def test_a_template_error_carries_no_transformation_of_a_value(
    tmp_path: Path, expression: str
) -> None:
    (tmp_path / "leaky").mkdir()
    (tmp_path / "leaky" / "subject.txt.j2").write_text(expression)
    (tmp_path / "leaky" / "body.txt.j2").write_text("x")

    with pytest.raises(TemplateError) as caught:
        TemplateRenderer(tmp_path).render("leaky", {"lookup": {}}, {"code": CODE})

    prefix, detail = str(caught.value).split(" failed: ")
    assert prefix == "template leaky/subject.txt.j2"
    assert not any(ch.isdigit() for ch in detail), detail  # no digit of the code, in any order
    assert caught.value.__cause__ is None


def test_a_missing_variable_is_named_only_from_the_template_source(tmp_path: Path) -> None:
    (tmp_path / "named").mkdir()
    (tmp_path / "named" / "subject.txt.j2").write_text("{{ greeting }} {{ lookup[code] }}")
    (tmp_path / "named" / "body.txt.j2").write_text("x")
    renderer = TemplateRenderer(tmp_path)

    with pytest.raises(TemplateError) as missing:
        renderer.render("named", {"lookup": {}}, {"code": CODE})
    with pytest.raises(TemplateError) as lookup:
        renderer.render("named", {"lookup": {}, "greeting": "Hi"}, {"code": CODE})

    assert (
        str(missing.value)
        == "template named/subject.txt.j2 failed: variable 'greeting' is undefined"
    )
    assert str(lookup.value) == "template named/subject.txt.j2 failed: UndefinedError"


def test_a_failing_filter_reports_only_the_exception_type(tmp_path: Path) -> None:
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "subject.txt.j2").write_text('{{ "%d" % code }}')
    (tmp_path / "broken" / "body.txt.j2").write_text("x")

    with pytest.raises(TemplateError) as caught:
        TemplateRenderer(tmp_path).render("broken", {}, {"code": CODE})

    assert str(caught.value) == "template broken/subject.txt.j2 failed: TypeError"


def test_a_syntax_error_names_the_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "otp").mkdir()
    (tmp_path / "otp" / "body.txt.j2").write_text("line one\n{% if code %}\n")

    with pytest.raises(TemplateError, match=r"otp/body.txt.j2 has a syntax error on line \d"):
        TemplateRenderer(tmp_path).render("otp", {}, {"code": CODE})


def test_a_missing_templates_directory_is_a_template_error(tmp_path: Path) -> None:
    with pytest.raises(TemplateError, match="does not exist"):
        TemplateRenderer(tmp_path / "nope")


def test_a_rendered_email_keeps_its_content_out_of_its_repr(renderer: TemplateRenderer) -> None:
    email = renderer.render("otp", {"minutes_valid": 10}, {"code": CODE})

    assert CODE in email.text
    assert CODE not in repr(email)
    assert "verification code" not in repr(email)


def test_every_built_in_email_keeps_its_lines_short_enough_to_travel_as_7bit(
    renderer: TemplateRenderer,
) -> None:
    # A link longer than a line goes quoted-printable, whatever the template does with it.
    data = {"name": "Ada Lovelace", "minutes_valid": 10, "product_name": "Example"}
    variables = {"code": CODE, "link": "https://example.com/v/t0k3n", "inviter": "Grace"}

    for template in BUILTIN_TEMPLATES:
        email = renderer.render(template, data, variables)
        assert email.html is not None
        for line in (*email.text.splitlines(), *email.html.splitlines()):
            assert len(line) <= 78, (template, line)


def test_the_html_title_heads_the_page_names_the_article_and_is_the_heading(
    renderer: TemplateRenderer,
) -> None:
    email = renderer.render("otp", {}, {"code": CODE})

    assert email.html is not None
    assert "<title>Your verification code</title>" in email.html
    assert 'aria-label="Your verification code"' in email.html
    assert ">Your verification code</h1>" in email.html


def test_one_message_leaves_nothing_of_itself_in_the_next(renderer: TemplateRenderer) -> None:
    first = renderer.render("otp", {"name": "Ada", "product_name": "Acme"}, {"code": CODE})
    second = renderer.render("otp", {}, {"code": "135790"})

    assert "Ada" in first.text
    assert "Acme" in first.subject
    assert second.html is not None
    for part in (second.subject, second.text, second.html):
        assert "Ada" not in part
        assert "Acme" not in part
        assert CODE not in part
