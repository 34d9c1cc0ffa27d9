"""Seeded generators of initial states for BFCL's eight environments (no sample starts from a BFCL test config).

`generate_state(env, seed)` returns a config in the shape the environment's
``_load_scenario`` reads (the same keys as BFCL's ``initial_config`` entries),
drawn from vocabularies here: file trees with their own folder names, file
names and contents; message workspaces with their own people and inboxes;
Twitter accounts and tweets; ticket queues; portfolios (BFCL's stock universe,
because ``get_symbol_by_name`` maps a fixed list of names, with prices,
orders, watch lists and balances drawn here); travel accounts with cards and
budgets (no access token: a session starts by authenticating); vehicles with
drawn fuel, doors, tyres and climate. `MathAPI` has no state (its config is
``{}``). `contamination` checks the drawn configs against BFCL's test entries.
"""

from __future__ import annotations

import random
from typing import Any

FIRST = ["Amara", "Bruno", "Chiara", "Dmitri", "Esme", "Farid", "Greta", "Hiro", "Ines", "Jonas", "Kalani", "Lior",
         "Maren", "Nikhil", "Odile", "Priya", "Quentin", "Rosa", "Soren", "Tamsin", "Umar", "Vera", "Wren",
         "Yusuf"]  # fmt: skip
LAST = ["Okafor", "Lindqvist", "Moreau", "Tanaka", "Castillo", "Novak", "Haddad", "Brennan", "Iyer", "Kowalski",
        "Fontaine", "Mbeki", "Duarte", "Sorensen", "Whitlock", "Achebe"]  # fmt: skip
TOPICS = ["garden", "harbor", "orbit", "lantern", "meadow", "circuit", "glacier", "canyon", "violin", "atlas",
          "pepper", "quartz", "saffron", "tundra", "willow", "ember"]  # fmt: skip
FOLDERS = ["projects", "invoices", "photos", "research", "drafts", "music", "recipes", "contracts", "travel", "notes",
           "exports", "slides", "lab", "assets"]  # fmt: skip
EXTENSIONS = [".txt", ".md", ".csv", ".log", ".json"]
SENTENCES = [
    "Inventory count for the {t} depot is due on Thursday.",
    "The {t} prototype passed its second stress test.",
    "Remember to renew the {t} subscription before the end of the month.",
    "Minutes: the {t} team agreed to move the launch by one week.",
    "Shipping labels for the {t} order were printed twice.",
    "Draft outline for the {t} workshop, sections one to four.",
    "Sensor readings from the {t} station look stable overnight.",
    "Budget request for the {t} initiative needs a second signature.",
]
TICKET_TITLES = ["Printer jams on floor {n}", "VPN drops every hour", "Badge reader offline at gate {n}",
                 "Laptop battery swelling", "Shared drive quota exceeded", "Projector flickers in room {n}",
                 "Password reset loop", "Email sync delayed"]  # fmt: skip
TICKET_STATUS = ["Open", "In Progress", "Resolved", "Closed"]
# get_symbol_by_name knows exactly these companies: the universe is BFCL's, every number in it is drawn here
STOCKS = ["AAPL", "GOOG", "TSLA", "MSFT", "NVDA", "ZETA", "ALPH", "OMEG", "QUAS", "NEPT", "SYNX", "AMZN"]
CARD_TYPES = ["Visa", "Mastercard", "Amex", "Discover"]


def _sentence(rng: random.Random) -> str:
    return rng.choice(SENTENCES).format(t=rng.choice(TOPICS))


def _file_name(rng: random.Random, taken: set) -> str:
    while True:
        name = f"{rng.choice(TOPICS)}_{rng.choice(['plan', 'log', 'list', 'memo', 'data', 'v2', 'final'])}"
        name += rng.choice(EXTENSIONS)
        if name not in taken:
            taken.add(name)
            return name


def _directory(rng: random.Random, depth: int, taken: set) -> dict:
    contents: dict = {}
    for _ in range(rng.randint(1, 4)):
        contents[_file_name(rng, taken)] = {"type": "file", "content": " ".join(_sentence(rng) for _ in range(2))}
    if depth > 0:
        for folder in rng.sample(FOLDERS, k=rng.randint(1, 2)):
            if folder not in taken:
                taken.add(folder)
                contents[folder] = {"type": "directory", "contents": _directory(rng, depth - 1, taken)}
    return contents


def gorilla_file_system(rng: random.Random) -> dict:
    home = f"{rng.choice(FIRST).lower()}_{rng.randint(10, 99)}"
    return {"root": {home: {"type": "directory", "contents": _directory(rng, 2, {home})}}}


def math_api(rng: random.Random) -> dict:
    return {}


def _people(rng: random.Random, n: int) -> list[str]:
    return rng.sample(FIRST, k=n)


def message_api(rng: random.Random) -> dict:
    names = _people(rng, rng.randint(3, 6))
    user_map = {name: f"USR{i + 1:03d}" for i, name in enumerate(names)}
    ids = list(user_map.values())
    inbox = [{rng.choice(ids[1:]): _sentence(rng)} for _ in range(rng.randint(1, 4))]
    return {
        "user_count": len(names),
        "user_map": user_map,
        "inbox": inbox,
        "message_count": len(inbox),
        "current_user": rng.choice([None, ids[0]]),
    }


def twitter_api(rng: random.Random) -> dict:
    username = f"{rng.choice(TOPICS)}_{rng.choice(FIRST).lower()}"
    others = [f"{n.lower()}_{rng.choice(TOPICS)}" for n in _people(rng, 4)]
    tweets = {}
    for i in range(rng.randint(1, 4)):
        topic = rng.choice(TOPICS)
        tweets[str(i)] = {
            "id": i,
            "username": username if rng.random() < 0.7 else rng.choice(others),
            "content": _sentence(rng),
            "tags": [f"#{topic}"],
            "mentions": [],
        }
    return {
        "username": username,
        "password": f"{rng.choice(TOPICS).capitalize()}{rng.randint(100, 999)}!",
        "authenticated": False,
        "tweets": tweets,
        "comments": {},
        "retweets": {},
        "following_list": rng.sample(others, k=rng.randint(1, 3)),
        "tweet_counter": len(tweets),
    }


def ticket_api(rng: random.Random) -> dict:
    start = rng.randint(100, 9000)
    user = rng.choice(FIRST)
    queue: list[dict[str, Any]] = []
    for k in range(rng.randint(1, 4)):
        queue.append(
            {
                "id": start + k * rng.randint(1, 7),
                "title": rng.choice(TICKET_TITLES).format(n=rng.randint(2, 9)),
                "description": _sentence(rng),
                "status": rng.choice(TICKET_STATUS),
                "priority": rng.randint(1, 5),
                "created_by": user if rng.random() < 0.6 else rng.choice(FIRST),
            }
        )
    return {"ticket_queue": queue, "ticket_counter": queue[-1]["id"] + 1, "current_user": user}


def trading_bot(rng: random.Random) -> dict:
    stocks = {}
    for symbol in STOCKS:
        price = round(rng.uniform(20, 900), 2)
        stocks[symbol] = {
            "price": price,
            "percent_change": round(rng.uniform(-3, 3), 2),
            "volume": round(rng.uniform(0.2, 5), 3),
            "MA(5)": round(price * rng.uniform(0.97, 1.03), 2),
            "MA(20)": round(price * rng.uniform(0.94, 1.06), 2),
        }
    first = rng.randint(20000, 90000)
    orders = {}
    for k in range(rng.randint(1, 3)):
        symbol = rng.choice(STOCKS)
        orders[str(first + k)] = {
            "id": first + k,
            "order_type": rng.choice(["Buy", "Sell"]),
            "symbol": symbol,
            "price": stocks[symbol]["price"],
            "amount": rng.randint(1, 30),
            "status": rng.choice(["Completed", "Pending", "Open"]),
        }
    return {
        "orders": orders,
        "account_info": {
            "account_id": rng.randint(10000, 99999),
            "balance": float(rng.randint(20, 400) * 100),
            "binding_card": rng.randint(10**15, 10**16 - 1),
        },
        "authenticated": rng.random() < 0.5,
        "market_status": rng.choice(["Open", "Closed"]),
        "order_counter": first + len(orders),
        "stocks": stocks,
        "watch_list": rng.sample(STOCKS, k=rng.randint(1, 4)),
        "transaction_history": [],
    }


def travel_api(rng: random.Random) -> dict:
    cards = {}
    for _ in range(rng.randint(1, 3)):
        card_id = str(rng.randint(100000, 999999))
        cards[card_id] = {
            "card_number": "".join(str(rng.randint(0, 9)) for _ in range(16)),
            "card_type": rng.choice(CARD_TYPES),
            "expiration_date": f"{rng.randint(1, 12):02d}/{rng.randint(2027, 2032)}",
            "cardholder_name": "",
            "balance": float(rng.randint(10, 200) * 100),
        }
    first, last = rng.choice(FIRST), rng.choice(LAST)
    for card in cards.values():
        card["cardholder_name"] = f"{first} {last}"
    return {
        "credit_card_list": cards,
        "booking_record": {},
        "access_token": None,
        "token_type": None,
        "token_expires_in": None,
        "token_scope": None,
        "user_first_name": first,
        "user_last_name": last,
        "budget_limit": float(rng.randint(5, 60) * 500) if rng.random() < 0.5 else None,
    }


def vehicle_control_api(rng: random.Random) -> dict:
    doors = {d: rng.choice(["locked", "unlocked"]) for d in ("driver", "passenger", "rear_left", "rear_right")}
    tyres = {k: float(rng.randint(28, 36)) for k in ("frontLeft", "frontRight", "rearLeft", "rearRight")}
    return {
        "fuelLevel": round(rng.uniform(2, 45), 1),
        "batteryVoltage": round(rng.uniform(11.8, 13.2), 1),
        "engineState": "stopped",
        "remainingUnlockedDoors": sum(1 for s in doors.values() if s == "unlocked"),
        "doorStatus": doors,
        "acTemperature": float(rng.randint(16, 28)),
        "fanSpeed": rng.randint(1, 10) * 10,
        "acMode": rng.choice(["auto", "cool", "heat", "defrost"]),
        "humidityLevel": float(rng.randint(25, 70)),
        "headLightStatus": rng.choice(["on", "off"]),
        "parkingBrakeStatus": rng.choice(["engaged", "released"]),
        "parkingBrakeForce": 0.0,
        "slopeAngle": float(rng.randint(0, 8)),
        "distanceToNextVehicle": float(rng.randint(20, 120)),
        "cruiseStatus": "inactive",
        "destination": "None",
        **{f"{k}TirePressure": v for k, v in tyres.items()},
    }


GENERATORS = {
    "GorillaFileSystem": gorilla_file_system,
    "MathAPI": math_api,
    "MessageAPI": message_api,
    "TwitterAPI": twitter_api,
    "TicketAPI": ticket_api,
    "TradingBot": trading_bot,
    "TravelAPI": travel_api,
    "VehicleControlAPI": vehicle_control_api,
}


def generate_state(env: str, seed: int) -> dict:
    """The initial config of environment `env` for `seed` (deterministic)."""
    if env not in GENERATORS:
        raise KeyError(f"no initial-state generator for {env!r} (known: {sorted(GENERATORS)})")
    return GENERATORS[env](random.Random(f"{env}-{seed}"))
