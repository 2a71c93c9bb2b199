"""Synthetic support tickets: realistic categories, urgency and languages, any number.

The generator is deterministic for a seed, so a fixture recorded for 200 tickets today
matches the 200 tickets generated tomorrow.

    >>> tickets = generate_tickets(3, seed=7)
    >>> [t.id for t in tickets]
    ['T-0001', 'T-0002', 'T-0003']
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from pydantic import BaseModel, Field

__all__ = ["CATEGORIES", "LANGUAGES", "URGENCIES", "Ticket", "generate_tickets", "ground_truth"]

CATEGORIES = ("billing", "bug", "account", "shipping", "feature_request", "security")
URGENCIES = ("low", "normal", "high", "critical")
LANGUAGES = ("en", "de", "fr", "es")


class Ticket(BaseModel):
    """One support ticket as the triage job receives it."""

    id: str = Field(description="Ticket id, e.g. T-0042")
    customer: str = Field(description="Customer name")
    language: str = Field(description="ISO 639-1 code of the language the customer wrote in")
    subject: str
    body: str


_PRODUCTS = ("Pro plan", "Team plan", "mobile app", "invoice export", "API", "dashboard")
_NAMES = ("Ana Souza", "Jonas Weber", "Claire Martin", "Diego Ruiz", "Priya Nair", "Tom Okafor",
          "Mei Chen", "Lena Fischer", "Hugo Bernard", "Sofia Garcia", "Omar Haddad", "Eva Novak")

# (subject, body) templates per category and language; {product}, {amount}, {order}, {days}
_TEMPLATES: dict[str, dict[str, Sequence[tuple[str, str]]]] = {
    "billing": {
        "en": [("Charged twice for {product}",
                "Hi, my card was charged {amount} twice this month for the {product}. "
                "Please refund the duplicate charge."),
               ("Invoice shows wrong VAT",
                "The invoice for order {order} lists the wrong VAT number. "
                "Our accountant needs a corrected copy.")],
        "de": [("Doppelte Abbuchung für {product}",
                "Hallo, mir wurden diesen Monat {amount} zweimal für den {product} abgebucht. "
                "Bitte erstatten Sie den doppelten Betrag.")],
        "fr": [("Facturé deux fois pour {product}",
                "Bonjour, j'ai été débité deux fois de {amount} ce mois-ci pour le {product}. "
                "Merci de rembourser le doublon.")],
        "es": [("Cobro duplicado del {product}",
                "Hola, me cobraron {amount} dos veces este mes por el {product}. "
                "Por favor devuelvan el cargo duplicado.")],
    },
    "bug": {
        "en": [("{product} crashes on start",
                "Since yesterday's update the {product} crashes right after login. "
                "I reinstalled it and it still happens."),
               ("Export produces an empty file",
                "Every export from the {product} is an empty CSV. It worked {days} days ago.")],
        "de": [("{product} stürzt beim Start ab",
                "Seit dem Update gestern stürzt die {product} direkt nach dem Login ab.")],
        "fr": [("Le {product} plante au démarrage",
                "Depuis la mise à jour d'hier, le {product} plante juste après la connexion.")],
        "es": [("El {product} se cierra al abrir",
                "Desde la actualización de ayer el {product} se cierra al iniciar sesión.")],
    },
    "account": {
        "en": [("Cannot reset my password",
                "The reset link says it expired, every time, even when I click it at once."),
               ("Please change the account owner",
                "Our admin left the company {days} days ago. How do we move ownership?")],
        "de": [("Passwort lässt sich nicht zurücksetzen",
                "Der Link zum Zurücksetzen ist jedes Mal abgelaufen.")],
        "fr": [("Impossible de réinitialiser le mot de passe",
                "Le lien de réinitialisation est toujours expiré.")],
        "es": [("No puedo restablecer la contraseña",
                "El enlace para restablecer siempre dice que caducó.")],
    },
    "shipping": {
        "en": [("Order {order} has not arrived",
                "I ordered {days} days ago and tracking has not moved since. Where is it?")],
        "de": [("Bestellung {order} ist nicht angekommen",
                "Ich habe vor {days} Tagen bestellt, die Sendungsverfolgung steht still.")],
        "fr": [("Commande {order} non reçue",
                "J'ai commandé il y a {days} jours et le suivi ne bouge plus.")],
        "es": [("El pedido {order} no ha llegado",
                "Pedí hace {days} días y el seguimiento no avanza.")],
    },
    "feature_request": {
        "en": [("Dark mode for the {product}?",
                "Would love a dark mode in the {product}. Is it on the roadmap?")],
        "de": [("Dunkelmodus für {product}?", "Gibt es Pläne für einen Dunkelmodus?")],
        "fr": [("Mode sombre pour le {product} ?", "Un mode sombre est-il prévu ?")],
        "es": [("¿Modo oscuro en el {product}?", "¿Está previsto un modo oscuro?")],
    },
    "security": {
        "en": [("Someone logged into my account",
                "I got a login alert from a country I have never been to and my email was "
                "changed. Please lock the account now."),
               ("Possible data leak in {product}",
                "I can see another customer's invoices in the {product}. This looks serious.")],
        "de": [("Fremder Login in meinem Konto",
                "Ich habe eine Login-Warnung aus einem fremden Land bekommen. Bitte sperren!")],
        "fr": [("Connexion suspecte à mon compte",
                "Alerte de connexion depuis un pays inconnu, mon e-mail a été changé.")],
        "es": [("Alguien entró en mi cuenta",
                "Recibí una alerta de inicio de sesión desde otro país. Bloqueen la cuenta.")],
    },
}

_URGENCY_BY_CATEGORY = {
    "billing": (0.2, 0.5, 0.25, 0.05),
    "bug": (0.1, 0.4, 0.35, 0.15),
    "account": (0.2, 0.5, 0.25, 0.05),
    "shipping": (0.2, 0.5, 0.25, 0.05),
    "feature_request": (0.7, 0.3, 0.0, 0.0),
    "security": (0.0, 0.1, 0.4, 0.5),
}
_CATEGORY_WEIGHTS = (0.3, 0.25, 0.15, 0.15, 0.1, 0.05)
_LANGUAGE_WEIGHTS = (0.55, 0.2, 0.15, 0.1)


def generate_tickets(n: int, seed: int = 0) -> list[Ticket]:
    """``n`` synthetic tickets, the same for the same seed.

    Categories, languages and urgency follow weights typical of a SaaS support queue:
    billing and bugs most often, security rarely but urgently.
    """
    return [ticket for ticket, _, _ in _generate(n, seed)]


def ground_truth(n: int, seed: int = 0) -> dict[str, tuple[str, str]]:
    """Ticket id -> (category, urgency) the generator used; for scoring and stand-in answers."""
    return {ticket.id: (category, urgency) for ticket, category, urgency in _generate(n, seed)}


def _generate(n: int, seed: int) -> list[tuple[Ticket, str, str]]:
    if n < 0:
        raise ValueError("n must be >= 0")
    rng = random.Random(seed)
    out = []
    for i in range(1, n + 1):
        category = rng.choices(CATEGORIES, _CATEGORY_WEIGHTS)[0]
        urgency = rng.choices(URGENCIES, _URGENCY_BY_CATEGORY[category])[0]
        language = rng.choices(LANGUAGES, _LANGUAGE_WEIGHTS)[0]
        subject, body = rng.choice(_TEMPLATES[category][language])
        values = {
            "product": rng.choice(_PRODUCTS),
            "amount": f"{rng.choice((9, 19, 49, 99, 249))}.00 EUR",
            "order": f"#{rng.randint(10000, 99999)}",
            "days": rng.randint(2, 21),
        }
        ticket = Ticket(
            id=f"T-{i:04d}",
            customer=rng.choice(_NAMES),
            language=language,
            subject=subject.format(**values),
            body=body.format(**values),
        )
        out.append((ticket, category, urgency))
    return out
