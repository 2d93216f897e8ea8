"""``with ostiary.session(agent=...) as s:`` — a session for the length of a block.

Entering creates the session through the control API, writes its CA certificate to a file,
and (unless ``set_env=False``) points the process environment at the proxy for the block and
every subprocess started in it. Leaving puts the environment back, removes the file and tears
the session down — also when the block raised, since a session left behind keeps its budget
and its token valid until it expires. ``async with`` does the same with the ``async`` control
client.

Inside the block, :meth:`Session.client` and :meth:`Session.async_client` are ``httpx``
clients already configured with the proxy, the CA and the raising transport (they do not read
the environment, so they stay correct in threads and after the block), :meth:`Session.child`
spawns a sub-agent's session, and :meth:`Session.requests_session` gives a ``requests``
session configured the same way.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import httpx

from .control import AsyncControlClient, ControlClient
from .environment import EnvPatch, session_env, write_ca
from .errors import NotFound, OstiaryError
from .models import CreatedSession, SessionStatus
from .transport import AsyncRaisingTransport, RaisingTransport

if TYPE_CHECKING:
    import requests

__all__ = ["Session", "session"]

_UNSET: Any = object()

#: A control client, blocking or ``async``.
C = TypeVar("C", ControlClient, AsyncControlClient)


class Session:
    """One Ostiary session, as a context manager (``with`` or ``async with``).

    Construct it with :func:`session` (or :meth:`Session.child`); nothing is sent until the
    block is entered. ``wait_for_approval`` is the default for the clients it makes: how long
    a held request may wait for a human before :class:`~ostiary.errors.ApprovalPending` is
    raised (``None``: raise at once).
    """

    def __init__(
        self,
        agent: str | None = None,
        *,
        parent: Session | None = None,
        control: ControlClient | AsyncControlClient | None = None,
        control_url: str | None = None,
        admin_token: str | None = None,
        tenant: str | None = None,
        ttl: str | timedelta | None = None,
        max_calls: int | None = None,
        max_cost: float | None = None,
        max_bytes_sent: int | None = None,
        max_bytes_received: int | None = None,
        max_pending_approvals: int | None = None,
        profile: str | None = None,
        wait_for_approval: timedelta | None = None,
        set_env: bool = True,
    ) -> None:
        self._agent = agent
        self._parent = parent
        self._control = control
        self._control_url = control_url
        self._admin_token = admin_token
        self._create: dict[str, Any] = {
            "tenant": tenant,
            "ttl": ttl,
            "max_calls": max_calls,
            "max_cost": max_cost,
            "max_bytes_sent": max_bytes_sent,
            "max_bytes_received": max_bytes_received,
            "max_pending_approvals": max_pending_approvals,
            "profile": profile,
        }
        self._wait = wait_for_approval
        self._set_env = set_env
        self._created: CreatedSession | None = None
        self._ca_path: str | None = None
        self._patch: EnvPatch | None = None
        self._owned: ControlClient | AsyncControlClient | None = None

    def __repr__(self) -> str:
        if self._created is None:
            return f"Session(agent={self._agent!r}, state='not started')"
        c = self._created
        return f"Session(id={c.session_id!r}, agent={c.agent!r}, proxy={c.proxy_address!r})"

    # ------------------------------------------------------------------ what it is

    @property
    def created(self) -> CreatedSession:
        """The session as the control API created it (raises outside the block)."""
        if self._created is None:
            raise RuntimeError("the session is not started: use it as `with session(...) as s:`")
        return self._created

    @property
    def id(self) -> str:
        return self.created.session_id

    @property
    def agent(self) -> str:
        return self.created.agent

    @property
    def token(self) -> str:
        """The session token (the proxy credential): keep it out of logs."""
        return self.created.token

    @property
    def proxy_url(self) -> str:
        """``http://agent:<token>@host:port``: contains the token."""
        return self.created.proxy_url

    @property
    def ca_pem(self) -> str:
        return self.created.ca_pem

    @property
    def ca_path(self) -> str:
        """The CA certificate's file, while the session is entered."""
        if self._ca_path is None:
            raise RuntimeError("the session is not started")
        return self._ca_path

    @property
    def env(self) -> dict[str, str]:
        """The variables a subprocess needs (already in ``os.environ`` inside the block
        unless ``set_env=False``): ``subprocess.run(cmd, env={**os.environ, **s.env})``."""
        return session_env(self.created, self.ca_path)

    # ------------------------------------------------------------------ clients

    def _ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cadata=self.ca_pem)

    def _wait_for(self, wait_for_approval: timedelta | None) -> timedelta | None:
        return self._wait if wait_for_approval is _UNSET else wait_for_approval

    def client(
        self,
        *,
        wait_for_approval: timedelta | None = _UNSET,
        http2: bool = False,
        **kwargs: Any,
    ) -> httpx.Client:
        """An ``httpx.Client`` through the proxy, trusting its CA, raising Ostiary's
        refusals. Other keyword arguments go to ``httpx.Client`` (``timeout`` defaults to
        30 s); it ignores the environment (``trust_env=False``)."""
        inner = httpx.HTTPTransport(proxy=self.proxy_url, verify=self._ssl_context(), http2=http2)
        transport = RaisingTransport(
            inner, wait_for_approval=self._wait_for(wait_for_approval), secrets=(self.token,)
        )
        kwargs.setdefault("timeout", 30.0)
        return httpx.Client(transport=transport, trust_env=False, **kwargs)

    def async_client(
        self,
        *,
        wait_for_approval: timedelta | None = _UNSET,
        http2: bool = False,
        **kwargs: Any,
    ) -> httpx.AsyncClient:
        """The ``httpx.AsyncClient`` twin of :meth:`client`."""
        inner = httpx.AsyncHTTPTransport(
            proxy=self.proxy_url, verify=self._ssl_context(), http2=http2
        )
        transport = AsyncRaisingTransport(
            inner, wait_for_approval=self._wait_for(wait_for_approval), secrets=(self.token,)
        )
        kwargs.setdefault("timeout", 30.0)
        return httpx.AsyncClient(transport=transport, trust_env=False, **kwargs)

    def requests_session(
        self, *, wait_for_approval: timedelta | None = _UNSET
    ) -> requests.Session:
        """A ``requests.Session`` through the proxy, trusting its CA, with
        :class:`~ostiary.requests_adapter.OstiaryAdapter` mounted (needs ``requests``)."""
        import requests

        from .requests_adapter import OstiaryAdapter

        http = requests.Session()
        http.trust_env = False
        http.proxies = {"http": self.proxy_url, "https": self.proxy_url}
        http.verify = self.ca_path
        adapter = OstiaryAdapter(
            wait_for_approval=self._wait_for(wait_for_approval), secrets=(self.token,)
        )
        http.mount("http://", adapter)
        http.mount("https://", adapter)
        return http

    def child(
        self,
        agent: str | None = None,
        *,
        ttl: str | timedelta | None = None,
        max_calls: int | None = None,
        max_cost: float | None = None,
        max_bytes_sent: int | None = None,
        max_bytes_received: int | None = None,
        max_pending_approvals: int | None = None,
        wait_for_approval: timedelta | None = _UNSET,
        set_env: bool = True,
    ) -> Session:
        """A child session (a sub-agent), created with this session's own token: it runs as
        this session's agent unless policy lets it spawn ``agent``, its budgets are carved
        out of what this one has left, and it never outlives it. Enter it like any session;
        leaving tears it down when the control client holds the admin token (a session
        cannot end its children itself), otherwise it ends with its parent."""
        self.created  # noqa: B018 - a child needs a started parent
        return Session(
            agent,
            parent=self,
            control=self._control,
            control_url=self._control_url,
            admin_token=self._admin_token,
            ttl=ttl,
            max_calls=max_calls,
            max_cost=max_cost,
            max_bytes_sent=max_bytes_sent,
            max_bytes_received=max_bytes_received,
            max_pending_approvals=max_pending_approvals,
            wait_for_approval=self._wait_for(wait_for_approval),
            set_env=set_env,
        )

    def status(self) -> SessionStatus:
        """``GET /v1/sessions/{id}`` (needs the admin token)."""
        control = self._sync_control()
        try:
            return control.session(self.id)
        finally:
            self._release(control)

    # ------------------------------------------------------------------ lifecycle

    def _sync_control(self) -> ControlClient:
        if isinstance(self._control, ControlClient):
            return self._control
        if isinstance(self._control, AsyncControlClient):
            return ControlClient(self._control.url, self._control._admin_token)
        return ControlClient(self._control_url, self._admin_token)

    def _async_control(self) -> AsyncControlClient:
        if isinstance(self._control, AsyncControlClient):
            return self._control
        if isinstance(self._control, ControlClient):
            return AsyncControlClient(self._control.url, self._control._admin_token)
        return AsyncControlClient(self._control_url, self._admin_token)

    def _release(self, control: ControlClient) -> None:
        if control is not self._control:
            control.close()

    def _create_args(self) -> dict[str, Any]:
        parent = self._parent.created if self._parent is not None else None
        return {"parent": parent, **self._create}

    def _begin(self, created: CreatedSession) -> None:
        self._created = created
        try:
            self._ca_path = write_ca(created.ca_pem)
            if self._set_env:
                self._patch = EnvPatch(session_env(created, self._ca_path))
                self._patch.apply()
        except BaseException:
            self._end_locally()
            raise

    def _end_locally(self) -> None:
        if self._patch is not None:
            self._patch.restore()
            self._patch = None
        if self._ca_path is not None:
            try:
                os.unlink(self._ca_path)
            except FileNotFoundError:
                pass
            self._ca_path = None

    def _may_tear_down(self, control: ControlClient | AsyncControlClient) -> bool:
        # A child made with its parent's token has no admin token to end it with: it ends
        # with its parent.
        return self._parent is None or bool(control._admin_token)

    @staticmethod
    def _report(failure: OstiaryError, raised: BaseException | None, session_id: str) -> None:
        if isinstance(failure, NotFound):
            return  # already gone (terminated by an operator, or with its parent)
        if raised is None:
            raise failure
        raised.add_note(f"tearing down the Ostiary session {session_id} failed too: {failure}")

    def _starting(self, control: Callable[[], C]) -> C:
        """The control client to create the session with, ``control()``, kept to close on
        leaving when it was made here rather than given."""
        if self._created is not None:
            raise RuntimeError("this session was already started")
        client = control()
        self._owned = client if client is not self._control else None
        return client

    def _leaving(self, kind: type[C]) -> tuple[str, C | None]:
        """Ends the session here (environment, CA file): its id, and the control client to
        tear it down with, ``None`` when this one may not."""
        created = self.created
        self._end_locally()
        control = self._owned or self._control
        assert isinstance(control, kind)
        return created.session_id, control if self._may_tear_down(control) else None

    def __enter__(self) -> Session:
        control = self._starting(self._sync_control)
        try:
            created = control.create_session(self._agent, **self._create_args())
        except BaseException:
            self._close_owned()
            raise
        self._begin(created)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        session_id, control = self._leaving(ControlClient)
        try:
            if control is not None:
                control.teardown(session_id)
        except OstiaryError as failure:
            self._report(failure, exc, session_id)
        finally:
            self._close_owned()

    async def __aenter__(self) -> Session:
        control = self._starting(self._async_control)
        try:
            created = await control.create_session(self._agent, **self._create_args())
        except BaseException:
            await self._aclose_owned()
            raise
        self._begin(created)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        session_id, control = self._leaving(AsyncControlClient)
        try:
            if control is not None:
                await control.teardown(session_id)
        except OstiaryError as failure:
            self._report(failure, exc, session_id)
        finally:
            await self._aclose_owned()

    def _close_owned(self) -> None:
        owned, self._owned = self._owned, None
        if isinstance(owned, ControlClient):
            owned.close()

    async def _aclose_owned(self) -> None:
        owned, self._owned = self._owned, None
        if isinstance(owned, AsyncControlClient):
            await owned.aclose()


def session(
    agent: str,
    *,
    control: ControlClient | AsyncControlClient | None = None,
    control_url: str | None = None,
    admin_token: str | None = None,
    tenant: str | None = None,
    ttl: str | timedelta | None = None,
    max_calls: int | None = None,
    max_cost: float | None = None,
    max_bytes_sent: int | None = None,
    max_bytes_received: int | None = None,
    max_pending_approvals: int | None = None,
    profile: str | None = None,
    wait_for_approval: timedelta | None = None,
    set_env: bool = True,
) -> Session:
    """A session for ``agent``, to enter with ``with`` or ``async with``.

    The control API is ``control`` if given, else ``control_url`` / ``admin_token``, else
    ``$OSTIARY_CONTROL_URL`` (default ``http://127.0.0.1:8081``) and
    ``$OSTIARY_ADMIN_TOKEN``. The budgets and ``ttl`` are the session's own
    (``POST /v1/sessions``); the proxy's ``[sessions]`` defaults fill in the rest.
    """
    return Session(
        agent,
        control=control,
        control_url=control_url,
        admin_token=admin_token,
        tenant=tenant,
        ttl=ttl,
        max_calls=max_calls,
        max_cost=max_cost,
        max_bytes_sent=max_bytes_sent,
        max_bytes_received=max_bytes_received,
        max_pending_approvals=max_pending_approvals,
        profile=profile,
        wait_for_approval=wait_for_approval,
        set_env=set_env,
    )
