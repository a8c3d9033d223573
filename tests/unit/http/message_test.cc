// Pure HTTP/1.1 framing: heads, targets, chunks.
#include "common/http/message.h"

#include <gtest/gtest.h>

namespace tidal::http {
namespace {

TEST(HttpMessage, ParsesRequestHeadWithCaseInsensitiveHeaders) {
  Request r;
  ASSERT_TRUE(ParseRequestHead("GET /api/v1/pods?limit=500&labelSelector=team%3Dml HTTP/1.1\r\n"
                               "Host: x\r\nAUTHORIZATION:  Bearer abc \r\n\r\n",
                               r)
                  .ok());
  EXPECT_EQ(r.method, "GET");
  EXPECT_EQ(r.path, "/api/v1/pods");
  EXPECT_EQ(r.QueryValue("labelSelector"), "team=ml");
  EXPECT_EQ(r.QueryValue("limit"), "500");
  EXPECT_EQ(r.headers.Get("authorization"), "Bearer abc");
}

TEST(HttpMessage, DecodesPlusAsSpaceOnlyInQuery) {
  Request r;
  r.target = "/a+b?x=c+d%2Ce";
  ASSERT_TRUE(ParseTarget(r).ok());
  EXPECT_EQ(r.path, "/a+b");
  EXPECT_EQ(r.QueryValue("x"), "c d,e");
}

TEST(HttpMessage, RejectsMalformedHeads) {
  Request r;
  EXPECT_FALSE(ParseRequestHead("GARBAGE\r\n\r\n", r).ok());
  Request r2;
  EXPECT_FALSE(ParseRequestHead("GET /x HTTP/2.0\r\n\r\n", r2).ok());
  Request r3;
  EXPECT_FALSE(ParseRequestHead("GET /x HTTP/1.1\r\nno colon here\r\n\r\n", r3).ok());
  Request r4;
  EXPECT_FALSE(ParseRequestHead("GET x HTTP/1.1\r\n\r\n", r4).ok());
  Request r5;
  r5.target = "/x?a=%zz";
  EXPECT_FALSE(ParseTarget(r5).ok());
}

TEST(HttpMessage, FramingFollowsRfc9112) {
  Headers chunked;
  chunked.Set("Transfer-Encoding", "chunked");
  EXPECT_EQ(RequestFraming(chunked)->kind, BodyFraming::kChunked);
  Headers length;
  length.Set("Content-Length", "12");
  EXPECT_EQ(RequestFraming(length)->length, 12u);
  Headers bad;
  bad.Set("Content-Length", "12x");
  EXPECT_FALSE(RequestFraming(bad).ok());
  EXPECT_EQ(RequestFraming(Headers())->length, 0u);
  EXPECT_EQ(ResponseFraming("GET", 200, Headers())->kind, BodyFraming::kUntilClose);
  EXPECT_EQ(ResponseFraming("HEAD", 200, length)->length, 0u);
  EXPECT_EQ(ResponseFraming("GET", 204, Headers())->kind, BodyFraming::kLength);
}

TEST(HttpMessage, EncodesChunksInHex) {
  EXPECT_EQ(EncodeChunk(std::string(26, 'a')), "1a\r\n" + std::string(26, 'a') + "\r\n");
}

TEST(HttpMessage, ParsesStatusLine) {
  Response r;
  ASSERT_TRUE(ParseResponseHead("HTTP/1.1 410 Gone\r\nContent-Length: 0\r\n\r\n", r).ok());
  EXPECT_EQ(r.status, 410);
  Response bad;
  EXPECT_FALSE(ParseResponseHead("HTTP/1.1 abc\r\n\r\n", bad).ok());
}

}  // namespace
}  // namespace tidal::http
