// JsonReader: the one reader of JSON Tidal did not write — defaults for what is absent, an error
// naming the field and what it held for what is of the wrong type, nothing coerced.
#include "common/json_reader.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace tidal {
namespace {

using nlohmann::json;

TEST(JsonReaderTest, AbsentAndNullFieldsKeepTheirDefaultsAndPresentOnesReadAsTheyAre) {
  const json j = {{"n", 7}, {"s", "x"}, {"b", true}, {"d", 2.5}, {"null", nullptr}};
  JsonReader in;
  EXPECT_EQ(in.Get<int64_t>(j, "status", "n", 0), 7);
  EXPECT_EQ(in.Get<std::string>(j, "status", "s", ""), "x");
  EXPECT_EQ(in.Get<bool>(j, "status", "b", false), true);
  EXPECT_EQ(in.Get<double>(j, "status", "d", 0), 2.5);
  EXPECT_EQ(in.Get<double>(j, "status", "n", 0), 7.0);  // an integer is a number
  EXPECT_EQ(in.Get<int64_t>(j, "status", "absent", 3), 3);
  EXPECT_EQ(in.Get<int64_t>(j, "status", "null", 4), 4);
  EXPECT_EQ(in.Get<int64_t>(json::array(), "status", "n", 5), 5);  // not an object: no fields
  EXPECT_TRUE(in.ok()) << in.status().ToString();
}

TEST(JsonReaderTest, EachWrongTypeIsAnErrorNamingTheFieldWhatWasExpectedAndWhatItHeld) {
  const std::vector<std::pair<std::function<void(JsonReader&)>, std::string>> cases = {
      {[](JsonReader& in) {
         in.Get<int64_t>(json{{"n", "5"}}, "status", "n", 0);
       },
       R"(status.n: expected an integer, got "5")"},
      {[](JsonReader& in) {
         in.Get<int64_t>(json{{"n", 2.5}}, "status", "n", 0);
       },
       "status.n: expected an integer, got 2.5"},
      {[](JsonReader& in) {
         in.Get<int32_t>(json{{"n", int64_t{1} << 40}}, "", "n", 0);
       },
       "n: expected an integer, got 1099511627776"},
      {[](JsonReader& in) {
         in.Get<uint32_t>(json{{"n", -1}}, "", "n", 0);
       },
       "n: expected an integer, got -1"},
      {[](JsonReader& in) {
         in.Get<bool>(json{{"b", "yes"}}, "a.b", "b", false);
       },
       R"(a.b.b: expected true or false, got "yes")"},
      {[](JsonReader& in) {
         in.Get<std::string>(json{{"s", 1}}, "x", "s", "");
       },
       "x.s: expected a string, got 1"},
      {[](JsonReader& in) {
         in.Get<double>(json{{"d", "1"}}, "x", "d", 0);
       },
       R"(x.d: expected a number, got "1")"},
      {[](JsonReader& in) {
         in.Strings(json{{"l", {"a", 1}}}, "x", "l");
       },
       R"(x.l: expected a list of strings, got ["a",1])"},
      {[](JsonReader& in) {
         in.Object(json{{"o", "a"}}, "x", "o");
       },
       R"(x.o: expected an object, got "a")"},
      {[](JsonReader& in) {
         in.Array(json{{"a", json::object()}}, "x", "a");
       },
       "x.a: expected a list, got {}"},
  };
  for (const auto& [read, expected] : cases) {
    JsonReader in;
    read(in);
    ASSERT_FALSE(in.ok()) << expected;
    EXPECT_EQ(in.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(in.status().message(), expected);
  }
}

TEST(JsonReaderTest, TheFirstErrorIsKeptAndLaterReadsStillReturnTheirDefaults) {
  const json j = {{"a", "1"}, {"b", "2"}, {"c", 3}};
  JsonReader in;
  EXPECT_EQ(in.Get<int64_t>(j, "", "a", 10), 10);
  EXPECT_EQ(in.Get<int64_t>(j, "", "b", 20), 20);
  EXPECT_EQ(in.Get<int64_t>(j, "", "c", 30), 3);
  EXPECT_EQ(in.status().message(), R"(a: expected an integer, got "1")");
}

TEST(JsonReaderTest, AValueShownInAnErrorIsCutOnACharacterAndNeverThrowsOnBadUtf8) {
  JsonReader in;
  const std::string long_text(100, 'x');
  in.Get<int64_t>(json{{"n", long_text}}, "", "n", 0);
  EXPECT_EQ(in.status().message(), "n: expected an integer, got \"" + std::string(76, 'x') + "...");
  // Two-byte characters across the cut: the message stays valid UTF-8.
  std::string accents;
  for (int i = 0; i < 60; ++i) accents += "\xc3\xa9";
  const std::string shown = json_read::Shown(json(accents));
  EXPECT_NO_THROW(json(shown).dump()) << shown;
  // Bytes that are not UTF-8 are shown as U+FFFD instead of throwing.
  JsonReader bad;
  EXPECT_NO_THROW(bad.Get<int64_t>(json{{"n", std::string("\xff\xfe")}}, "", "n", 0));
  EXPECT_EQ(bad.status().message(), "n: expected an integer, got \"\xef\xbf\xbd\xef\xbf\xbd\"");
}

}  // namespace
}  // namespace tidal
