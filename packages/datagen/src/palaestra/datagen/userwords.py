"""What a user says they want, per tool: requests in a user's words, not the tool's own description.

BFCL's descriptions are documentation ("Display the contents of a file of any
extension from currrent directory"); a user says "show me what's in a file".
`USER_GOALS` holds, for each tool of BFCL's eight environments, a few ways a
user states that goal (base-form verb phrases, so they fit the query
writer's openers). `user_goal` draws one with the sample's rng; a tool not
listed (a registered environment's) gets a phrase built from its name
(``get_order_details`` -> "check the order details"), never its description.
"""

from __future__ import annotations

import random
import re

USER_GOALS: dict[str, list[str]] = {
    # GorillaFileSystem
    "cat": ["show me what's in a file", "print a file for me", "open a file and show me its text"],
    "cd": ["go into a folder", "switch to another folder", "move into a directory"],
    "cp": ["make a copy of something", "duplicate a file"],
    "diff": ["show me how two files differ", "compare two of my files"],
    "du": ["tell me how much space this folder takes", "check the disk usage here"],
    "echo": ["put some text into a file", "write a line out"],
    "find": ["look for files by name", "search for something by its name"],
    "grep": ["find the lines in a file that mention something", "search inside a file"],
    "ls": ["show me what's in this folder", "list what I have here"],
    "mkdir": ["make a new folder", "create a folder"],
    "mv": ["move or rename something", "relocate a file"],
    "pwd": ["tell me which folder I'm in", "show me where I am in the file system"],
    "rm": ["delete something", "get rid of a file"],
    "rmdir": ["delete a folder", "remove an empty directory"],
    "sort": ["sort a file's lines", "put the lines of a file in order"],
    "tail": ["show me the end of a file", "show the last lines of a file"],
    "touch": ["create an empty file", "make a new file"],
    "wc": ["count what's in a file", "tell me how long a file is"],
    # MathAPI
    "absolute_value": ["drop the sign of a number", "tell me how far a number is from zero"],
    "add": ["add up a pair of numbers", "work out a sum"],
    "divide": ["work out a division for me", "work out a quotient"],
    "imperial_si_conversion": ["convert a measurement between imperial and metric", "change a unit for me"],
    "logarithm": ["work out a logarithm", "compute a log"],
    "max_value": ["find the largest of some numbers", "tell me the biggest number in a list"],
    "mean": ["average some numbers", "work out the mean of a few numbers"],
    "min_value": ["find the smallest of some numbers", "tell me the lowest number in a list"],
    "multiply": ["multiply a pair of numbers", "work out a product"],
    "percentage": ["tell me what percent one number is of another", "work out a percentage"],
    "power": ["raise a number to a power", "work out an exponent"],
    "round_number": ["round a number", "round off a value"],
    "si_unit_conversion": ["convert between two metric units", "change a metric unit"],
    "square_root": ["take a square root", "work out the square root of a number"],
    "standard_deviation": ["tell me how spread out some numbers are", "get the standard deviation of a list"],
    "subtract": ["take one number away from another", "work out a difference"],
    "sum_values": ["total up a list of numbers", "add up several numbers"],
    # MessageAPI
    "add_contact": ["save someone as a contact", "add a person to my contacts"],
    "delete_message": ["take back the last message I sent someone", "delete my latest message to someone"],
    "get_message_stats": ["show me my messaging numbers", "give me stats on my messages"],
    "get_user_id": ["find someone's user id", "look up a person's id"],
    "list_users": ["show me everyone in the workspace", "list the people here"],
    "message_get_login_status": ["check whether I'm logged in to messaging", "see if my messaging login is active"],
    "message_login": ["sign me in to messaging", "log me in to the message app"],
    "search_messages": ["find messages that mention something", "search my messages"],
    "send_message": ["send someone a message", "message a person for me"],
    "view_messages_sent": ["show me the messages I've sent", "pull up my sent messages"],
    # TwitterAPI
    "authenticate_twitter": ["sign me in to my Twitter account", "log me in on Twitter"],
    "comment": ["reply to a tweet", "leave a comment on a tweet"],
    "follow_user": ["follow someone", "start following an account"],
    "get_tweet": ["pull up a tweet", "show me a particular tweet"],
    "get_tweet_comments": ["show me the replies to a tweet", "read the comments on a tweet"],
    "get_user_stats": ["show me an account's numbers", "check someone's Twitter stats"],
    "get_user_tweets": ["show me what someone has tweeted", "list an account's tweets"],
    "list_all_following": ["show me who I follow", "list the accounts I'm following"],
    "mention": ["tag some people in a tweet", "mention a few accounts on a tweet"],
    "post_tweet": ["tweet something for me", "post a tweet"],
    "posting_get_login_status": ["check whether I'm signed in to Twitter", "see if my Twitter login is active"],
    "retweet": ["retweet something", "share a tweet again"],
    "search_tweets": ["find tweets about something", "search Twitter"],
    "unfollow_user": ["unfollow someone", "stop following an account"],
    # TicketAPI
    "close_ticket": ["close out one of my tickets", "mark a ticket as closed"],
    "create_ticket": ["open a new support ticket", "file a ticket"],
    "edit_ticket": ["change a ticket", "update a ticket's details"],
    "get_ticket": ["pull up a ticket", "show me a ticket"],
    "get_user_tickets": ["show me my tickets", "list the tickets I opened"],
    "logout": ["sign me out of the ticket system", "log me out"],
    "resolve_ticket": ["mark a ticket as resolved", "resolve a ticket"],
    "ticket_get_login_status": ["check whether I'm logged in to the ticket system", "see if I'm signed in"],
    "ticket_login": ["sign me in to the ticket system", "log me in to support"],
    # TradingBot
    "add_to_watchlist": ["put a stock on my watchlist", "start watching a stock"],
    "cancel_order": ["call off an order", "cancel one of my orders"],
    "filter_stocks_by_price": ["find stocks in a price range", "show me stocks between two prices"],
    "fund_account": ["put money into my trading account", "top up my account"],
    "get_account_info": ["show me my account", "check my trading account"],
    "get_available_stocks": ["show me what stocks a sector has", "list the stocks in a sector"],
    "get_current_time": ["tell me the time", "check what time it is"],
    "get_order_details": ["show me an order", "check on an order"],
    "get_order_history": ["show me my past orders", "list my order ids"],
    "get_stock_info": ["check how a stock is doing", "look up a stock"],
    "get_symbol_by_name": ["find a company's ticker", "look up the symbol of a company"],
    "get_transaction_history": ["show me my transactions", "list my account activity"],
    "get_watchlist": ["show me my watchlist", "tell me what I'm watching"],
    "notify_price_change": ["warn me about big price moves", "check some stocks for big swings"],
    "place_order": ["buy or sell some shares", "put in an order"],
    "remove_stock_from_watchlist": ["take a stock off my watchlist", "stop watching a stock"],
    "trading_get_login_status": ["check whether I'm logged in to trading", "see if my trading login is active"],
    "trading_login": ["sign me in to my trading account", "log me in to trading"],
    "trading_logout": ["sign me out of trading", "log me out of my trading account"],
    "withdraw_funds": ["take money out of my account", "withdraw some cash"],
    # TravelAPI
    "authenticate_travel": ["sign me in to the travel site", "log me in for travel booking"],
    "book_flight": ["book me a flight", "get me a seat on a flight"],
    "cancel_booking": ["cancel a trip I booked", "call off a booking"],
    "compute_exchange_rate": ["convert some money to another currency", "tell me what an amount is worth abroad"],
    "contact_customer_support": ["get support to help with a booking", "reach customer support"],
    "get_all_credit_cards": ["show me the cards I've registered", "list my credit cards"],
    "get_booking_history": ["show me my past bookings", "list my trips"],
    "get_budget_fiscal_year": ["tell me the budget year", "check my fiscal year budget"],
    "get_credit_card_balance": ["check how much is on a card", "tell me a card's balance"],
    "get_flight_cost": ["tell me what a flight costs", "price a flight"],
    "get_nearest_airport_by_city": ["find the airport closest to a city", "tell me which airport serves a city"],
    "list_all_airports": ["show me every airport you know", "list the airports"],
    "purchase_insurance": ["get travel insurance", "insure a trip"],
    "register_credit_card": ["save a new credit card", "add a card to my account"],
    "retrieve_invoice": ["get me the invoice for a trip", "pull up a booking's invoice"],
    "set_budget_limit": ["set a travel budget", "cap my spending"],
    "travel_get_login_status": ["check whether I'm logged in for travel", "see if my travel login is active"],
    "verify_traveler_information": ["check a traveller's details", "verify my travel details"],
    # VehicleControlAPI
    "activateParkingBrake": ["set the parking brake", "engage or release the handbrake"],
    "adjustClimateControl": ["change the car's temperature", "set the climate in the car"],
    "check_tire_pressure": ["check my tyres", "tell me the tire pressures"],
    "displayCarStatus": ["show me the car's status", "check on part of the car"],
    "display_log": ["show me the car's log", "print the car's log"],
    "estimate_distance": ["tell me how far apart two cities are", "work out the distance between two places"],
    "estimate_drive_feasibility_by_mileage": ["tell me if I can drive that far", "check whether my fuel covers a trip"],
    "fillFuelTank": ["fill up the tank", "add fuel to the car"],
    "find_nearest_tire_shop": ["find a tire shop near me", "tell me where the nearest tyre shop is"],
    "gallon_to_liter": ["convert gallons to litres", "tell me how many litres that is"],
    "get_current_speed": ["tell me how fast I'm going", "check my speed"],
    "get_outside_temperature_from_google": ["check the temperature outside", "tell me how warm it is outside"],
    "get_outside_temperature_from_weather_com": ["find out how warm it is out there", "check the weather outside"],
    "get_zipcode_based_on_city": ["find a city's zip code", "look up the zipcode of a city"],
    "liter_to_gallon": ["convert litres to gallons", "tell me how many gallons that is"],
    "lockDoors": ["lock or unlock the doors", "deal with the car doors"],
    "pressBrakePedal": ["press the brake", "push the brake pedal"],
    "releaseBrakePedal": ["let go of the brake", "release the brake pedal"],
    "setCruiseControl": ["set the cruise control", "turn on cruise control"],
    "setHeadlights": ["set the headlights", "switch the lights"],
    "set_navigation": ["navigate me somewhere", "set the GPS to a destination"],
    "startEngine": ["start the car", "turn the engine on or off"],
}
"""Tool -> ways a user states that goal (base-form verb phrases)."""
VERBS = {"get": "check", "set": "set", "list": "show me", "view": "show me", "display": "show me"}


def user_goal(tool: str, rng: random.Random) -> str:
    """One way a user states `tool`'s goal: from `USER_GOALS`, else from the tool's name."""
    if tool in USER_GOALS:
        return rng.choice(USER_GOALS[tool])
    parts = re.findall(r"[a-z0-9]+", re.sub(r"([a-z])([A-Z])", r"\1 \2", tool).lower())
    if not parts:
        return "do this"
    verb = VERBS.get(parts[0], parts[0])
    rest = " ".join(parts[1:])
    return f"{verb} the {rest}" if rest else verb
