"""The routes of `leasebox web`, on aiohttp, with pages rendered by Jinja2 on the server.

Every page but `/healthz`, `/login` and the style sheet needs a viewer (`auth`); every
response carries a strict Content-Security-Policy (no script at all, styles from the server
only), `no-store` and `nosniff`. The database is read through a small pool of synchronous
connections in worker threads, so the repository functions `leasebox` already has serve the
pages as they are. An unreachable database is a 503 page in one line, never a traceback.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any, TypeVar
from urllib.parse import urlencode

import psycopg
from aiohttp import web
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from psycopg_pool import ConnectionPool

from leasebox.errors import ConfigurationError
from leasebox.inspection.aftermath import when
from leasebox.inspection.narrative import duration
from leasebox.web import actions, reading
from leasebox.web.auth import (
    CSRF_COOKIE,
    TOKEN_COOKIE,
    Viewer,
    authenticate,
    csrf_problem,
    csrf_token,
    new_csrf_cookie,
    viewer_of_token,
)
from leasebox.web.settings import WebSettings

log = logging.getLogger("leasebox.web")
VIEWER = web.RequestKey("viewer", Viewer)
CSRF_SEED = web.RequestKey("csrf_cookie", str)
T = TypeVar("T")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PUBLIC = frozenset({"/healthz", "/login", "/static/leasebox.css"})
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def templates() -> Environment:
    env = Environment(
        loader=PackageLoader("leasebox.web", "templates"),
        autoescape=select_autoescape(default=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["when"] = when
    env.filters["duration"] = duration
    return env


class WebApp:
    """The application's state: settings, the connection pool and the templates."""

    def __init__(self, settings: WebSettings, pool: ConnectionPool[Any]) -> None:
        self.settings = settings
        self.pool = pool
        self.env = templates()
        self.css = resources.files("leasebox.web").joinpath("static", "leasebox.css").read_bytes()

    # -- plumbing ----------------------------------------------------------------------------

    async def db(self, work: Callable[[psycopg.Connection[Any]], T]) -> T:
        def run() -> T:
            with self.pool.connection() as conn:
                return work(conn)

        return await asyncio.to_thread(run)

    def page(
        self, request: web.Request, template: str, status: int = 200, **context: Any
    ) -> web.Response:
        viewer: Viewer | None = request.get(VIEWER)
        html = self.env.get_template(template).render(
            viewer=viewer,
            read_only=not self.settings.allow_actions,
            auth=self.settings.auth,
            csrf=csrf_token(self.settings, request[CSRF_SEED]),
            path=request.path,
            **context,
        )
        return web.Response(status=status, text=html, content_type="text/html", charset="utf-8")

    @web.middleware
    async def guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        cookie = request.cookies.get(CSRF_COOKIE)
        request[CSRF_SEED] = cookie or new_csrf_cookie()
        try:
            if request.path in PUBLIC:
                response = await handler(request)
            else:
                viewer = authenticate(self.settings, request.headers, request.cookies)
                if viewer is None:
                    response = self.unauthorized(request)
                else:
                    request[VIEWER] = viewer
                    response = await handler(request)
        except web.HTTPException as exc:  # a 404 of the router, a 413 of a large form
            response = web.Response(status=exc.status, text=exc.text or exc.reason)
        except (psycopg.OperationalError, psycopg.InterfaceError, TimeoutError) as exc:
            log.warning("database unavailable (%s)", type(exc).__name__)
            response = self.page(
                request,
                "problem.html",
                status=503,
                title="Database unavailable",
                problem=f"The database does not answer ({type(exc).__name__}); try again soon.",
            )
        if cookie is None:
            response.set_cookie(
                CSRF_COOKIE,
                request[CSRF_SEED],
                httponly=True,
                samesite="Strict",
                secure=request.secure,
                path="/",
            )
        response.headers.update(SECURITY_HEADERS)
        return response

    def unauthorized(self, request: web.Request) -> web.Response:
        response = self.page(
            request,
            "problem.html",
            status=401,
            title="Sign in needed",
            problem="This page needs a token or a sign-in through your proxy.",
            login=self.settings.auth == "token",
        )
        if self.settings.auth == "token":
            response.headers["WWW-Authenticate"] = 'Bearer realm="leasebox"'
        return response

    # -- pages -------------------------------------------------------------------------------

    async def overview(self, request: web.Request) -> web.Response:
        seen = await self.db(lambda conn: reading.overview(conn, self.settings))
        return self.page(request, "overview.html", title="Overview", overview=seen)

    async def dead_letters(self, request: web.Request) -> web.Response:
        form = dict(request.query)
        try:
            chosen = reading.dead_letter_query(form, limit=reading.PAGE_SIZE)
        except ConfigurationError as exc:
            return self.page(
                request, "problem.html", status=400, title="Bad filter", problem=str(exc)
            )
        schema = self.settings.schema
        found = await self.db(lambda conn: reading.dead_letters(conn, chosen, schema=schema))
        return self.page(
            request,
            "dead_letters.html",
            title="Dead letters",
            found=found,
            given=chosen.given,
            query=urlencode(chosen.given),
            page_size=reading.PAGE_SIZE,
            actions=actions.actions_of("dead-letters"),
            notice=request.query.get("notice", ""),
        )

    async def message(self, request: web.Request) -> web.Response:
        outbox_id = int(request.match_info["id"])
        viewer = request[VIEWER]
        schema = self.settings.schema
        story = await self.db(
            lambda conn: reading.message_story(
                conn, outbox_id, schema=schema, show_recipients=viewer.operator
            )
        )
        if story is None:
            return self.page(
                request,
                "problem.html",
                status=404,
                title="No such message",
                problem=f"No message has outbox id {outbox_id}.",
            )
        return self.page(request, "message.html", title=f"Message {outbox_id}", send=story)

    async def audit(self, request: web.Request) -> web.Response:
        schema = self.settings.schema
        entries = await self.db(lambda conn: actions.recent(conn, schema=schema))
        return self.page(request, "audit.html", title="Audit trail", entries=entries)

    async def healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def css_file(self, _: web.Request) -> web.Response:
        return web.Response(body=self.css, content_type="text/css")

    # -- signing in with a token -------------------------------------------------------------

    async def login_form(self, request: web.Request) -> web.Response:
        return self.page(request, "login.html", title="Sign in", error="")

    async def login(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()
        token = str(form.get("token", ""))
        if self.settings.auth != "token" or viewer_of_token(self.settings, token) is None:
            return self.page(
                request, "login.html", status=401, title="Sign in", error="That token is wrong."
            )
        response = see_other("/")
        response.set_cookie(
            TOKEN_COOKIE, token, httponly=True, samesite="Strict", secure=request.secure, path="/"
        )
        return response

    async def logout(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()
        problem = csrf_problem(
            self.settings, request.headers, request.cookies, str(form.get("csrf", ""))
        )
        if problem:
            return web.Response(status=403, text=problem)
        response = see_other("/login")
        response.del_cookie(TOKEN_COOKIE, path="/")
        return response

    # -- actions -----------------------------------------------------------------------------

    async def act(self, request: web.Request) -> web.StreamResponse:
        action = actions.ACTIONS.get(request.match_info["name"])
        if action is None:
            return web.Response(status=404, text="no such action")
        viewer = request[VIEWER]
        posted = await request.post()
        form = {k: str(v) for k, v in posted.items() if isinstance(v, str)}
        selection = {k: v for k, v in form.items() if k in action.fields and v}
        schema = self.settings.schema

        def audited(
            outcome: actions.ActionResult, affected: int = 0, detail: str | None = None
        ) -> Any:
            return lambda conn: actions.record(
                conn,
                actor=viewer.name,
                action=action.name,
                outcome=outcome,
                selection=selection,
                affected=affected,
                detail=detail,
                schema=schema,
            )

        refusal = csrf_problem(self.settings, request.headers, request.cookies, form.get("csrf"))
        if refusal is None and not self.settings.allow_actions:
            refusal = "the server runs read-only (start it with --allow-actions)"
        if refusal is None and not viewer.operator:
            refusal = f"{viewer.name} has the {viewer.role} role; {action.label} needs operator"
        if refusal is not None:
            await self.db(audited("refused", detail=refusal))
            return self.page(
                request, "problem.html", status=403, title="Refused", problem=f"Refused: {refusal}."
            )
        try:
            if form.get("confirm") != "yes":
                count, said = await self.db(lambda conn: action.preview(conn, form, schema))
                return self.page(
                    request,
                    "confirm.html",
                    title=f"{action.label}?",
                    action=action,
                    count=count,
                    said=said,
                    selection=selection,
                    back=f"/{action.page}?{urlencode(selection)}",
                )

            def run(conn: psycopg.Connection[Any]) -> int:
                affected = action.run(conn, form, schema)
                audited("done", affected)(conn)
                return affected

            affected = await self.db(run)
        except ConfigurationError as exc:
            return self.page(
                request, "problem.html", status=400, title="Bad filter", problem=str(exc)
            )
        log.info(
            "%s by %s: %d rows", action.name, viewer.name, affected, extra={"action": action.name}
        )
        notice = f"{action.done} {affected} by {viewer.name}"
        return see_other(f"/{action.page}?{urlencode({**selection, 'notice': notice})}")


def see_other(location: str) -> web.Response:
    """A 303 to `location`: where a POST's browser goes next with a GET."""
    return web.Response(status=303, headers={"Location": location})


def build_app(settings: WebSettings, pool: ConnectionPool[Any]) -> web.Application:
    """The application with every route, over `pool`'s connections."""
    state = WebApp(settings, pool)
    app = web.Application(middlewares=[state.guard], client_max_size=64 * 1024)
    app.router.add_get("/", state.overview)
    app.router.add_get("/dead-letters", state.dead_letters)
    app.router.add_get(r"/messages/{id:\d{1,18}}", state.message)
    app.router.add_get("/audit", state.audit)
    app.router.add_post("/actions/{name}", state.act)
    app.router.add_get("/login", state.login_form)
    app.router.add_post("/login", state.login)
    app.router.add_post("/logout", state.logout)
    app.router.add_get("/healthz", state.healthz)
    app.router.add_get("/static/leasebox.css", state.css_file)
    return app
